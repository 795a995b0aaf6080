"""``hsextract regenerate`` against a real HTTP server in SGLang's shapes (tests/regen_server.py): accounting,
bad rows, refusals, retries, the identity check, resume after SIGKILL. Greedy equality with transformers
through the embedded server: tests/test_regenerate_model.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hsextract.cli import main
from hsextract.contract.rids import parse_rid
from hsextract.dev.sample_data import make_sample_conversations
from hsextract.prepare.model_tokenizer import load_model_tokenizer
from hsextract.regen import RegenerateConfig, Regeneration
from hsextract.regen.client import make_rid
from hsextract.regen.metrics import RegenMetrics
from hsextract.regen.prompts import Prompter, end_of_turn_ids, shape_answer, stop_token_ids

from .regen_server import FakeSGLang, write_rows

ROOT = Path(__file__).resolve().parents[1]


def _run(fake: FakeSGLang, dataset: Path, output: Path, **settings: Any) -> Any:
    config = RegenerateConfig(server=fake.url, dataset=dataset, output=output, progress=False, health_timeout_s=10,
                              retry_backoff_s=0.01, **settings)
    metrics = RegenMetrics(CollectorRegistry())
    return Regeneration(config, metrics).run(), metrics


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


BAD_ROWS: list[Any] = [
    "{not json",
    [1, 2],
    {"id": "no-user", "messages": [{"role": "assistant", "content": "hi"}]},
    {"id": "bad-role", "messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
    {"id": "no-assistant", "messages": [{"role": "user", "content": "only a question"}]},
    {"id": "long", "messages": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "x"}]},
]


def test_every_row_is_accounted_for_in_order_with_its_schema_and_metadata(fake: FakeSGLang, tmp_path: Path) -> None:
    good = [json.loads(line) for line in make_sample_conversations(tmp_path / "c.jsonl", 6, 1).read_text().splitlines()]
    messages = [json.loads(line) for line in
                make_sample_conversations(tmp_path / "m.jsonl", 2, 2, "messages").read_text().splitlines()]
    rows = [good[0], *BAD_ROWS[:3], good[1], messages[0], *BAD_ROWS[3:], good[2], messages[1], good[3]]
    dataset = write_rows(tmp_path / "in.jsonl", rows)
    fake.refuse_longer_than = 300
    summary, metrics = _run(fake, dataset, tmp_path / "out.jsonl", concurrency=4)
    counts = summary.counts
    assert summary.status == "complete"
    assert counts["ok"] + counts["failed"] + counts["skipped"] == counts["rows_in"] == len(rows)
    assert counts["failed_by_reason"] == {"no user turn": 1, "not_json": 1, "not an object": 1, "server refused": 1,
                                          "unknown role": 1}
    assert counts["skipped_by_reason"] == {"no assistant turn": 1}  # nothing to regenerate: no failure (issue 39)
    out = _lines(tmp_path / "out.jsonl")
    ok_inputs = [r for r in rows if isinstance(r, dict) and r not in BAD_ROWS]
    assert [r["id"] for r in out] == [r["id"] for r in ok_inputs]  # input order, id kept
    for given, got in zip(ok_inputs, out, strict=True):
        field = "conversations" if "conversations" in given else "messages"
        assert [set(t) for t in got[field]] == [set(t) for t in given[field]]  # the input's schema, turn for turn
        assistant = [j for j, t in enumerate(given[field]) if t.get("from", t.get("role")) in ("gpt", "assistant")]
        assert [t["turn"] for t in got["regen"]["turns"]] == assistant
        assert all(t["finish_reason"] == "stop" for t in got["regen"]["turns"])
        assert got["regen"]["model"] == fake.model_path and got["regen"]["sampling"]["temperature"] == 0.0
        for j, turn in enumerate(given[field]):  # user turns as given
            if j not in assistant:
                assert got[field][j] == turn
    errors = _lines(tmp_path / "out.jsonl.journal" / "errors.jsonl")
    assert [e["row"] for e in errors] == [1, 2, 3, 6, 7, 8]
    assert errors[-1]["reason"] == "server refused" and "context length" in errors[-1]["message"]
    assert metrics.rows.labels("ok")._value.get() == counts["ok"]
    assert metrics.generated_tokens._value.get() == counts["generated_tokens"] > 0
    # every request: rendered ids, no extraction rid, the end-of-turn stop id, greedy
    for request in fake.requests:
        assert parse_rid(request["rid"]) is None and request["rid"].startswith("regen-")
        assert request["sampling_params"]["stop_token_ids"] and request["sampling_params"]["temperature"] == 0.0
        assert "sampling_seed" not in request["sampling_params"]


def test_each_turn_is_prompted_with_the_answers_before_it(fake: FakeSGLang, chat_model: Path, tmp_path: Path) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 3, 4)
    _run(fake, dataset, tmp_path / "out.jsonl", concurrency=1)
    prompter = Prompter(load_model_tokenizer(chat_model, None, False), [], {})
    sent = {tuple(r["input_ids"]) for r in fake.requests}
    for row in _lines(tmp_path / "out.jsonl"):
        turns = [{"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]), "content": t["value"]}
                 for t in row["conversations"]]
        for meta in row["regen"]["turns"]:
            assert tuple(prompter.prompt_ids(turns[: meta["turn"]], None)) in sent


def test_last_turn_only_keeps_the_earlier_answers(fake: FakeSGLang, tmp_path: Path) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 4, 5)
    given = _lines(dataset)
    summary, _ = _run(fake, dataset, tmp_path / "out.jsonl", turns="last")
    assert summary.counts["turns_regenerated"] == 4
    for before, after in zip(given, _lines(tmp_path / "out.jsonl"), strict=True):
        last = max(j for j, t in enumerate(before["conversations"]) if t["from"] == "gpt")
        assert after["conversations"][:last] == before["conversations"][:last]
        assert after["conversations"][last] != before["conversations"][last]


def test_truncated_turns_are_marked_and_dropped_on_request(fake: FakeSGLang, tmp_path: Path) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 8, 6)
    summary, _ = _run(fake, dataset, tmp_path / "kept.jsonl", max_new_tokens=4)
    truncated = summary.counts["truncated_turns"]
    rows = _lines(tmp_path / "kept.jsonl")
    marked = [r for r in rows if any(t["finish_reason"] == "length" for t in r["regen"]["turns"])]
    assert truncated > 0 and marked and len(rows) == 8
    summary, _ = _run(fake, dataset, tmp_path / "dropped.jsonl", max_new_tokens=4, drop_truncated=True)
    assert summary.counts["skipped"] == len(marked) == summary.counts["skipped_by_reason"]["truncated turn"]
    assert summary.counts["ok"] + summary.counts["skipped"] == 8
    assert len(_lines(tmp_path / "dropped.jsonl")) == 8 - len(marked)


def test_transient_errors_are_retried_and_a_rerun_is_already_complete(fake: FakeSGLang, tmp_path: Path) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 3, 7)
    fake.fail_first = 3
    summary, metrics = _run(fake, dataset, tmp_path / "out.jsonl", concurrency=1)
    assert summary.status == "complete" and summary.counts["ok"] == 3
    assert metrics.retries._value.get() == 3
    assert len({r["rid"] for r in fake.requests}) == len(fake.requests)  # a new rid per try
    sent = len(fake.requests)
    again, _ = _run(fake, dataset, tmp_path / "out.jsonl", concurrency=1)
    assert again.status == "already complete" and len(fake.requests) == sent


def test_a_row_whose_tries_all_fail_is_retried_by_the_rerun(fake: FakeSGLang, tmp_path: Path) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 8)
    fake.fail_first = 2
    summary, _ = _run(fake, dataset, tmp_path / "out.jsonl", concurrency=1, max_attempts=2)
    assert summary.status == "incomplete" and summary.counts["failed_by_reason"] == {"server error": 1}
    assert not (tmp_path / "out.jsonl").exists()  # OUT is only ever complete
    summary, _ = _run(fake, dataset, tmp_path / "out.jsonl", concurrency=1, max_attempts=2)
    assert summary.status == "complete" and summary.counts["ok"] == 2 and summary.resumed == 1
    assert [r["id"] for r in _lines(tmp_path / "out.jsonl")] == ["sample-0", "sample-1"]


def test_a_rerun_with_another_setting_is_refused_naming_both(fake: FakeSGLang, tmp_path: Path, capsys: Any) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 9)
    _run(fake, dataset, tmp_path / "out.jsonl")
    code = main(["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(tmp_path / "out.jsonl"),
                 "--max-new-tokens", "64", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "IdentityMismatchError" in err and "max_new_tokens 2048 (this run: 64)" in err


def test_a_server_that_does_not_decode_stops_the_run_before_any_row(fake: FakeSGLang, tmp_path: Path,
                                                                    capsys: Any) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 9)
    fake.prefill_only = True
    code = main(["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(tmp_path / "out.jsonl"),
                 "--no-progress"])
    assert code == 2 and "does not generate" in capsys.readouterr().err
    assert len(fake.requests) == 1 and not (tmp_path / "out.jsonl.journal" / "rows.jsonl").read_bytes()


def test_a_run_where_rows_failed_exits_3(fake: FakeSGLang, tmp_path: Path, capsys: Any) -> None:
    good = [json.loads(line) for line in make_sample_conversations(tmp_path / "c.jsonl", 2, 10).read_text().splitlines()]
    dataset = write_rows(tmp_path / "in.jsonl", [good[0], BAD_ROWS[3], good[1]])
    args = ["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(tmp_path / "out.jsonl"),
            "--no-progress"]
    assert main(args) == 3  # issue 29, item 5: the README's "some rows failed"
    captured = capsys.readouterr()
    assert "COMPLETE" in captured.out and "failed 1 (unknown role 1)" in captured.out
    assert "1 rows failed (unknown role 1)" in captured.err and "errors.jsonl" in captured.err
    assert len(_lines(tmp_path / "out.jsonl")) == 2
    assert main(args) == 3 and "1 rows failed" in capsys.readouterr().err  # ALREADY COMPLETE says it again


@pytest.mark.parametrize("content", ['{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n' * 4, "", "\n\n"],
                         ids=["token-rows", "empty", "blank-lines"])
def test_an_input_with_no_conversation_is_refused_before_any_request(fake: FakeSGLang, tmp_path: Path,
                                                                     content: str, capsys: Any) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(content)
    out = tmp_path / "out.jsonl"
    code = main(["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--dataset {dataset} " in err and "nothing was sent" in err and "regenerate answers conversations" in err
    assert ("token rows (input_ids" in err) == bool(content.strip())
    assert fake.requests == [] and not out.exists() and not (tmp_path / "out.jsonl.journal").exists()


@pytest.mark.parametrize("case", ["the-input", "a-hard-link-of-the-input", "an-unrelated-file"])
def test_an_output_that_is_the_input_or_not_regenerates_is_refused_before_any_request(
    fake: FakeSGLang, tmp_path: Path, case: str, capsys: Any
) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 3, 12)
    given = dataset.read_bytes()
    out = {"the-input": dataset, "a-hard-link-of-the-input": tmp_path / "link.jsonl",
           "an-unrelated-file": tmp_path / "notes.jsonl"}[case]
    if case == "a-hard-link-of-the-input":
        os.link(dataset, out)
    elif case == "an-unrelated-file":
        out.write_text('{"keep": "me"}\n')
    kept = out.read_bytes()
    code = main(["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err  # issue 39, item 1: the input lost a row; an unrelated file was overwritten
    assert f"--output {out} " in err and "another --output" in err
    assert fake.requests == [] and dataset.read_bytes() == given and out.read_bytes() == kept
    assert not out.with_name(out.name + ".journal").exists()


def test_parquet_output_in_the_input_schema(fake: FakeSGLang, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    dataset = make_sample_conversations(tmp_path / "c.jsonl", 3, 10, "messages")
    summary, _ = _run(fake, dataset, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert summary.status == "complete" and [r["id"] for r in table] == ["sample-0", "sample-1", "sample-2"]
    assert set(table[0]["messages"][0]) == {"role", "content"}


def _start_and_signal(fake: FakeSGLang, tmp_path: Path, sig: signal.Signals) -> tuple[list[str], dict[str, str], int]:
    """Start the CLI on 24 conversations, send ``sig`` once 5 rows are settled; (command, env, exit code)."""
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 24, 11)
    fake.delay_s = 0.05
    command = [sys.executable, "-m", "hsextract", "regenerate", "--server", fake.url, "--dataset", str(dataset),
               "--output", str(tmp_path / "out.jsonl"), "--concurrency", "4", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "extractor")}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "out.jsonl.journal" / "rows.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count("\n") < 5):
        time.sleep(0.02)
    process.send_signal(sig)
    return command, env, process.wait(timeout=60)


def test_sigterm_stops_with_130_leaving_only_settled_rows(fake: FakeSGLang, tmp_path: Path) -> None:
    _, _, code = _start_and_signal(fake, tmp_path, signal.SIGTERM)
    rows = _lines(tmp_path / "out.jsonl.journal" / "rows.jsonl")
    assert code == 130 and 5 <= len(rows) < 24 and not (tmp_path / "out.jsonl").exists()
    assert len({r["row"] for r in rows}) == len(rows) and all(r["status"] == "ok" for r in rows)


def test_sigkill_mid_run_then_the_same_command_gives_every_row_once(fake: FakeSGLang, tmp_path: Path) -> None:
    command, env, _ = _start_and_signal(fake, tmp_path, signal.SIGKILL)
    output, journal, dataset = tmp_path / "out.jsonl", tmp_path / "out.jsonl.journal" / "rows.jsonl", tmp_path / "c.jsonl"
    settled = journal.read_text().count("\n")
    assert 5 <= settled < 24 and not output.exists()
    with open(journal, "ab") as handle:  # as if the kill had torn a record mid-write
        handle.write(b'{"row": 23, "status": "ok", "outp')
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = _lines(output)
    assert [r["id"] for r in rows] == [f"sample-{i}" for i in range(24)]
    fake.delay_s = 0.0
    _run(fake, dataset, tmp_path / "straight.jsonl", concurrency=4)
    assert rows == _lines(tmp_path / "straight.jsonl")  # the same rows as an uninterrupted run


def test_stop_ids_are_eos_and_the_templates_end_of_turn(tmp_path: Path) -> None:
    from hsextract.dev.tiny_model import make_tiny_model

    for family, token in (("chatml", "<|im_end|>"), ("llama3", "<|eot_id|>"), ("kimi_k2", "<|im_end|>"),
                          ("deepseek_v3", "<\uff5cend\u2581of\u2581sentence\uff5c>")):
        path = make_tiny_model(tmp_path / family, arch="llama", layers=7, hidden=32,
                               vocab_size=512, chat_family=family)
        model = load_model_tokenizer(path, None, False)
        wanted = model.tokenizer.convert_tokens_to_ids(token)
        assert end_of_turn_ids(model.tokenizer) == [wanted], family
        assert wanted in stop_token_ids(model, path)


def test_reasoning_keep_drop_split() -> None:
    text = "<think>\nstep one\n</think>\n\nThe answer."
    assert shape_answer(text, "keep").content == text
    assert shape_answer(text, "drop").content == "The answer." and shape_answer(text, "drop").reasoning is None
    split = shape_answer(text, "split")
    assert (split.content, split.reasoning) == ("The answer.", "step one")
    # the template's generation prompt opened the block; an answer cut inside the block is all thinking
    assert shape_answer("step</think>ok", "split").reasoning == "step"
    assert shape_answer("<think>never closed", "split").content == ""
    assert shape_answer("plain", "split").reasoning is None


def test_rids_are_never_extraction_rids() -> None:
    rid = make_rid("ab12cd34", 7, 3, 1)
    assert parse_rid(rid) is None and parse_rid(rid, "regen") is None


def test_pipeline_regenerate_prepare_extract_verify_then_all_skipped(fake: FakeSGLang, model_dir: Any,
                                                                       start_server: Any, tmp_path: Path,
                                                                       capsys: Any) -> None:
    import yaml

    from hsextract.output.data_config import read_data_config

    model = model_dir()
    fake.model_path = str(model)
    server = start_server(model)
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 4, 12)
    config = {
        "regenerate": {"server": fake.url, "dataset": str(dataset), "output": str(tmp_path / "regen.jsonl"),
                       "max_new_tokens": 8, "progress": False},
        "prepare": {"model": str(model), "output": str(tmp_path / "prepared"), "progress": False,
                    "specforge_template": "kimi-k2-instruct"},
        "extract": {"server": server.url, "output": str(tmp_path / "out"), "health_timeout_s": 30},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["pipeline", "--config", str(path)]) == 0
    printed = capsys.readouterr().out  # the extract step's summary and its train command (issue 29 item 14)
    assert f"COMPLETE: {tmp_path / 'out'}" in printed and "output holds 4 samples" in printed
    assert f"  specforge train --config {(tmp_path / 'out').resolve() / 'specforge_train.yaml'}" in printed
    data = read_data_config(tmp_path / "out")
    assert data is not None and data.complete and data.sources is not None
    regen = data.sources["regenerate"]
    assert regen["identity"]["sampling"]["max_new_tokens"] == 8 and regen["counts"]["ok"] == 4
    assert data.sources["prepare"]["settings"]["input_path"] == str(tmp_path / "regen.jsonl")
    fake.stop()  # the regeneration server is gone: a complete regenerate step is skipped without it
    assert main(["pipeline", "--config", str(path)]) == 0  # every step complete: skipped


def test_pipeline_checks_every_section_before_the_first_step(fake: FakeSGLang, tmp_path: Path, capsys: Any) -> None:
    import yaml

    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 13)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "regenerate": {"server": fake.url, "dataset": str(dataset), "output": str(tmp_path / "r.jsonl")},
        "prepare": {"model": fake.model_path, "output": str(tmp_path / "p")},
        "extract": {"output": str(tmp_path / "o"), "max_seq_lenn": 4},
    }))
    assert main(["pipeline", "--config", str(path)]) == 2
    assert "section extract" in capsys.readouterr().err and fake.requests == []


def test_metrics_port_serves_the_regen_series(fake: FakeSGLang, tmp_path: Path) -> None:
    import httpx

    from .helpers import free_port

    port = free_port()
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 14)
    summary, _ = _run(fake, dataset, tmp_path / "out.jsonl", metrics_port=port)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert f'hsextract_regen_rows_total{{status="ok"}} {float(summary.counts["ok"])}' in text
    for name in ("hsextract_regen_generated_tokens_total", "hsextract_regen_inflight_requests 0.0",
                 "hsextract_regen_rows_planned 2.0", "hsextract_regen_running 0.0", "hsextract_regen_turns_total"):
        assert name in text
    # every error reason has its series from the start, so the dashboard's panels show 0, not "no data"
    from hsextract.regen.metrics import ERROR_REASONS

    assert 'hsextract_regen_errors_total{reason="server error"} 0.0' in text and len(ERROR_REASONS) > 10
    for reason in ERROR_REASONS:
        assert f'hsextract_regen_errors_total{{reason="{reason}"}}' in text


def test_a_moved_model_with_the_same_fingerprint_is_the_same_identity() -> None:
    from dataclasses import replace

    from hsextract.regen.journal import RegenIdentity, mismatches

    identity = RegenIdentity("/models/a", "sha256:1", "tok", "tpl", {"max_new_tokens": 8, "seed": None}, "all", "keep",
                             None, False, "/data/in.jsonl", None, "sha256:in", 4)
    assert mismatches(identity, replace(identity, model_path="/elsewhere/a", input_path="/moved/in.jsonl")) == []
    assert mismatches(identity, replace(identity, model_fingerprint="sha256:2")) == [
        "model_fingerprint 'sha256:1' (this run: 'sha256:2')"]
    unknown = replace(identity, model_fingerprint=None)
    assert mismatches(unknown, replace(unknown, model_path="/other")) == ["model_path '/models/a' (this run: '/other')"]
    assert mismatches(identity, replace(identity, reasoning="split", input_fingerprint="sha256:x")) == [
        "reasoning 'keep' (this run: 'split')", "input_fingerprint 'sha256:in' (this run: 'sha256:x')"]
