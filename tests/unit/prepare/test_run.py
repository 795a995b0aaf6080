"""prepare end to end on a real tokenizer: bad rows recorded and the run goes on; what stops before any work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from hsextract.cli import main
from hsextract.prepare import read_provenance
from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.conversation import Reason
from hsextract.prepare.run import run_prepare

GOOD = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello ✓"}]}
BAD: list[tuple[Any, str]] = [
    ({"conversations": "not a list"}, Reason.NOT_LIST),
    ([1, 2], Reason.NOT_OBJECT),
    ({"text": "no turns"}, Reason.NO_CONVERSATION),
    ({"messages": [{"role": "assistant", "content": "alone"}]}, Reason.NO_USER_TURN),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "bing", "content": "a"}]}, Reason.UNKNOWN_ROLE),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, Reason.CONTENT_NOT_TEXT),
    ({"messages": []}, Reason.EMPTY),
    ({"messages": [{"role": "user", "content": "only a question"}]}, Reason.NO_SUPERVISED_TOKEN),
]


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _config(model: Path, dataset: Path, output: Path, **kw: Any) -> PrepareConfig:
    return PrepareConfig(model=model, dataset=dataset, output=output, specforge_template="qwen", progress=False, **kw)


@pytest.mark.parametrize("like", ["specforge", "speculators"])
def test_bad_rows_are_recorded_and_the_run_goes_on(chatml_model: Path, tmp_path: Path, like: str) -> None:
    rows = [GOOD, *(raw for raw, _ in BAD), GOOD]
    source = _write(tmp_path / "c.jsonl", rows)
    with open(source, "a") as handle:
        handle.write("{broken\n")
    out = tmp_path / "out"
    config = PrepareConfig(model=chatml_model, dataset=source, output=out, like=like, progress=False, chunk_rows=3,
                           specforge_template="qwen" if like == "specforge" else None)
    summary = run_prepare(config)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    expected = {i + 1: reason for i, (_, reason) in enumerate(BAD)} | {len(rows): Reason.NOT_JSON}
    assert {e["row"]: e["reason"] for e in errors} == expected
    assert all(f"row {e['row']}" in e["message"] for e in errors)
    written = datasets.load_from_disk(str(out))
    assert sorted(written["source_row"]) == [0, len(rows) - 1]
    assert written.column_names == ["input_ids", "loss_mask", "source_row", "turn"]
    provenance = read_provenance(out)
    assert provenance is not None and provenance.counts == summary.counts
    assert provenance.counts["rows_in"] == len(rows) + 1 and provenance.counts["rows_out"] == 2
    assert provenance.counts["dropped_total"] == len(BAD) + 1
    assert provenance.settings.like == like and len(provenance.settings.chat_template_sha256) == 64
    assert not out.with_name("out.partial").exists()


def test_no_usable_row_writes_nothing(chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "c.jsonl", [raw for raw, _ in BAD])
    out = tmp_path / "out"
    code = main(["prepare", "--model", str(chatml_model), "--dataset", str(source), "--output", str(out),
                 "--specforge-template", "qwen", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ConfigError: --dataset") and "has no usable row" in err and "no user turn: 1" in err
    assert not out.exists() and not out.with_name("out.partial").exists()


def test_ambiguous_template_stops_before_any_work(chatml_model: Path, tmp_path: Path) -> None:
    source = _write(tmp_path / "c.jsonl", [GOOD])
    config = PrepareConfig(model=chatml_model, dataset=source, output=tmp_path / "out", progress=False)
    with pytest.raises(Exception, match=r"fits several SpecForge registry templates \(qwen, lfm, "):
        run_prepare(config)
    assert not (tmp_path / "out").exists()


def test_unique_template_is_the_default(llama3_model: Path, tmp_path: Path) -> None:
    source = _write(tmp_path / "c.jsonl", [GOOD])
    config = PrepareConfig(model=llama3_model, dataset=source, output=tmp_path / "out", progress=False)
    assert run_prepare(config).specforge_template == "llama3"


def test_unloadable_tokenizer_and_template(chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "c.jsonl", [GOOD])
    empty = tmp_path / "empty-model"
    empty.mkdir()
    args = ["prepare", "--dataset", str(source), "--output", str(tmp_path / "out"), "--no-progress"]
    assert main([*args, "--model", str(empty)]) == 2
    assert "cannot load the tokenizer of --model" in capsys.readouterr().err
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    assert main([*args, "--model", str(chatml_model), "--chat-template", str(broken)]) == 2
    assert "cannot render a user/assistant exchange" in capsys.readouterr().err
    assert main([*args, "--model", str(chatml_model), "--specforge-template", "nope"]) == 2
    assert "is not a SpecForge 0.2.0 registry template" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rerun_of_a_complete_output(chatml_model: Path, tmp_path: Path) -> None:
    source = _write(tmp_path / "c.jsonl", [GOOD, GOOD])
    config = _config(chatml_model, source, tmp_path / "out")
    first = run_prepare(config)
    again = run_prepare(config)
    assert again.already_complete and again.counts == first.counts
    with pytest.raises(Exception, match="made with other settings"):
        run_prepare(_config(chatml_model, source, tmp_path / "out", max_seq_len=64))


def test_not_prefix_stable_template(chatml_model: Path, tmp_path: Path) -> None:
    """A template whose history depends on the turns after it: speculators' BoundaryUnstableError, recorded."""
    counting = tmp_path / "counting.jinja"
    counting.write_text(
        "{{ '<|im_start|>system\\n' ~ (messages | length) ~ ' turns<|im_end|>\\n' }}"
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    source = _write(tmp_path / "c.jsonl", [GOOD])
    config = PrepareConfig(model=chatml_model, dataset=source, output=tmp_path / "out", like="speculators",
                           chat_template=counting, progress=False)
    with pytest.raises(Exception, match="template not prefix-stable: 1"):
        run_prepare(config)


def test_cli_with_a_config_file(chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "c.jsonl", [GOOD, {"messages": []}])
    config = tmp_path / "prepare.yaml"
    config.write_text(f"model: {chatml_model}\ndataset: {source}\nlike: speculators\nmax_seq_len: 512\nprogress: false\n")
    assert main(["prepare", "--config", str(config), "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "COMPLETE: " in out and "input rows 2: rows out 1 from 1 conversations; dropped 1 (empty conversation 1)" in out
    assert main(["prepare", "--config", str(config), "--output", str(tmp_path / "out")]) == 0
    assert "ALREADY COMPLETE" in capsys.readouterr().out
    assert main(["prepare", "--config", str(config), "--output", str(tmp_path / "o2"), "--specforge-template", "qwen"]) == 2
    assert "applies to --like specforge only" in capsys.readouterr().err


def test_no_progress_hides_every_bar_the_saving_of_the_dataset_included(
    chatml_model: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 item 14: datasets' own "Saving the dataset" bar showed through --no-progress."""
    from hsextract.dev.sample_data import make_sample_conversations

    source = make_sample_conversations(tmp_path / "c.jsonl", 4, 3)
    assert main(["prepare", "--model", str(chatml_model), "--dataset", str(source), "--output", str(tmp_path / "out"),
                 "--specforge-template", "qwen", "--no-progress"]) == 0  # fmt: skip
    printed = capfd.readouterr()
    assert "Saving the dataset" not in printed.err + printed.out and "it/s" not in printed.err


def test_max_seq_len_beyond_the_models_context_is_warned(
    chatml_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """issue 39, item 3: rows longer than the context would be refused by extract; said before any row is read."""
    import logging
    import shutil

    model = tmp_path / "model-64"
    shutil.copytree(chatml_model, model)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    source = _write(tmp_path / "c.jsonl", [GOOD])
    with caplog.at_level(logging.WARNING, logger="hsextract.prepare"):
        run_prepare(_config(model, source, tmp_path / "fits", max_seq_len=63))
        assert not caplog.records
        run_prepare(_config(model, source, tmp_path / "beyond", max_seq_len=100))
    message = caplog.records[0].getMessage()
    assert "--max-seq-len 100" in message and "max_position_embeddings 64" in message and "--max-seq-len 63" in message
