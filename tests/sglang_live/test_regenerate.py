"""Regeneration against the real SGLang server, through the CLI: ``hsextract regenerate`` greedy equals
transformers' ``generate(do_sample=False)`` token for token, alone and batched; ``hsextract pipeline``
goes from conversations to an output the trainers' own released loaders read (tests/trainers/read_output.py,
run in .venv-trainers), with data_config.json naming its sources and every row accounted for.

These run on the family the value tests started last (qwen2: ChatML, the tokenizer and chat template
``make-tiny-model`` writes), through the same session server: regeneration rids are not of the
extraction form, so its dump hook leaves them alone, and its radix cache is off, as extraction needs.
A handful of conversations and few new tokens keep it to seconds on a CPU.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from .helpers import HSEXTRACT, REPO, LiveServer, data_config, errors

FAMILY = "qwen2"
MAX_NEW = 10
CONVERSATIONS = 4
ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
TRAINERS_PYTHON = REPO / ".venv-trainers" / "bin" / "python"


@pytest.fixture(scope="module")
def server(live) -> LiveServer:  # type: ignore[no-untyped-def]
    started: LiveServer = live(FAMILY)
    return started


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("regen")


@pytest.fixture(scope="module")
def conversations(work: Path) -> Path:
    """ShareGPT conversations of one to four exchanges, one with a system prompt."""
    path = work / "conversations.jsonl"
    subprocess.run(
        [HSEXTRACT, "make-sample-data", str(path), "--conversations", "sharegpt", "--num", str(CONVERSATIONS),
         "--seed", "3"],
        check=True, capture_output=True,
    )  # fmt: skip
    rows = _jsonl(path)
    assert max(_assistant_turns(r) for r in rows) > 1 and any(r["conversations"][0]["from"] == "system" for r in rows)
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _assistant_turns(row: dict[str, Any]) -> int:
    return sum(1 for turn in row["conversations"] if turn["from"] == "gpt")


def _dump_entries(server: LiveServer) -> list[str]:
    return sorted(p.name for p in server.dump_dir.iterdir()) if server.dump_dir.exists() else []


def _regenerate(server: LiveServer, dataset: Path, output: Path, *args: str) -> list[dict[str, Any]]:
    argv = [HSEXTRACT, "regenerate", "--server", server.url, "--dataset", str(dataset), "--output", str(output),
            "--max-new-tokens", str(MAX_NEW), "--health-timeout-s", "60", "--no-progress", *args]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return _jsonl(output)


def test_greedy_regeneration_equals_transformers_generate_alone_and_batched(
    server: LiveServer, conversations: Path, tmp_path: Path
) -> None:
    """Every assistant turn is answered on the history of the answers regenerated before it; each answer
    is what transformers' greedy ``generate`` makes of the chat template's render of that history, with
    the same tokenizer: the same prompt length, the same text, the same number of tokens, the same finish."""
    import transformers

    dumps_before = _dump_entries(server)
    alone = _regenerate(server, conversations, tmp_path / "alone.jsonl", "--concurrency", "1")
    batched = _regenerate(server, conversations, tmp_path / "batched.jsonl", "--concurrency", str(CONVERSATIONS))
    assert _dump_entries(server) == dumps_before, "the dump hook dumped a regeneration request"
    assert batched == alone

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(server.model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(server.model), dtype=torch.float32).eval()
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    given = _jsonl(conversations)
    assert len(alone) == len(given)
    checked = later_turns = stopped = 0
    for before, after in zip(given, alone, strict=True):
        regen = after["regen"]
        assert regen["model"] == str(server.model) and regen["sampling"]["temperature"] == 0
        stops = regen["sampling"]["stop_token_ids"]
        assert end_of_turn in stops and tokenizer.eos_token_id in stops
        assistant = [i for i, turn in enumerate(before["conversations"]) if turn["from"] == "gpt"]
        assert [meta["turn"] for meta in regen["turns"]] == assistant
        for index, (old, new) in enumerate(zip(before["conversations"], after["conversations"], strict=True)):
            assert new["from"] == old["from"] and (index in assistant or new["value"] == old["value"])
        for meta in regen["turns"]:
            history = [{"role": ROLES[t["from"]], "content": t["value"]} for t in after["conversations"][: meta["turn"]]]
            text = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert meta["prompt_tokens"] == len(prompt)
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW,
                                     eos_token_id=stops, pad_token_id=end_of_turn)  # fmt: skip
            ids = out[0, len(prompt) :].tolist()
            cut = next((k for k, token in enumerate(ids) if token in stops), None)
            answer = ids if cut is None else ids[:cut]
            assert meta["generated_tokens"] == (len(ids) if cut is None else cut + 1)
            assert meta["finish_reason"] == ("length" if cut is None else "stop")
            assert after["conversations"][meta["turn"]]["value"] == tokenizer.decode(answer, skip_special_tokens=True)
            checked += 1
            later_turns += meta["turn"] > assistant[0]
            stopped += cut is not None
    assert checked == sum(map(_assistant_turns, given)) and later_turns > 0
    print(f"\n{checked} turns equal transformers' greedy generate ({later_turns} on regenerated history, {stopped} stopped)")
    calls = [line for line in server.stub_log.read_text().splitlines() if " call " in line]
    assert calls == [], f"SGLang's decoding called the stand-in sgl_kernel: {calls}"


def _read_with_the_trainer(fmt: str, output: Path) -> dict[int, dict[str, list[int]]]:
    """What the trainer's own released loader reads of ``output`` (tests/trainers/read_output.py)."""
    if not TRAINERS_PYTHON.exists():
        pytest.skip(f"{TRAINERS_PYTHON} is missing (make setup-trainers): the trainers' loaders were not run")
    result = subprocess.run(
        [str(TRAINERS_PYTHON), "-m", "tests.trainers.read_output", fmt, str(output)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    read = json.loads(result.stdout.splitlines()[-1])
    assert read["format"] == fmt
    return {int(row): sample for row, sample in read["rows"].items()}


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_the_pipeline_from_conversations_to_what_the_trainer_reads(
    server: LiveServer, conversations: Path, work: Path, fmt: str
) -> None:
    """``hsextract pipeline``: regenerate -> prepare (as that trainer) -> extract -> verify against the live
    server. Both formats share the regenerate section, so the second run skips that step. Every
    conversation, prepared row and sample is accounted for, and each row the trainer's loader yields is
    the prepared row, whose supervised tokens are the target's own regenerated answers."""
    import transformers
    from datasets import load_from_disk

    regenerated, prepared, output = work / "regenerated.jsonl", work / f"prepared-{fmt}", work / f"out-{fmt}"
    config = {
        "regenerate": {"server": server.url, "dataset": str(conversations), "output": str(regenerated),
                       "max_new_tokens": MAX_NEW, "concurrency": CONVERSATIONS, "health_timeout_s": 60,
                       "progress": False},
        "prepare": {"model": str(server.model), "output": str(prepared), "progress": False,
                    **({"specforge_template": "qwen"} if fmt == "specforge" else {})},  # ChatML fits several
        "extract": {"server": server.url, "output": str(output), "format": fmt, "dump_dir": str(server.dump_dir),
                    "concurrency": 4, "health_timeout_s": 60},
        "verify": True,
    }  # fmt: skip
    path = work / f"pipeline-{fmt}.yaml"
    path.write_text(yaml.safe_dump(config))
    shared = regenerated.exists()
    result = subprocess.run([HSEXTRACT, "pipeline", "--config", str(path)], capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PIPELINE COMPLETE" in result.stdout
    assert ("regenerate already complete" in result.stderr) == shared, result.stderr[-3000:]

    given, answers = _jsonl(conversations), _jsonl(regenerated)
    turns = sum(map(_assistant_turns, given))
    rows = load_from_disk(str(prepared))
    assert len(rows) == (turns if fmt == "speculators" else len(given))
    recorded = data_config(output)
    assert recorded["status"] == "complete" and recorded["format"] == fmt and errors(output) == []
    assert recorded["total_samples"] == len(rows) and recorded["failed_samples"] == recorded["bad_input_samples"] == 0
    assert recorded["total_tokens"] == sum(len(ids) for ids in rows["input_ids"])
    sources = recorded["sources"]
    regen = sources["regenerate"]
    assert regen["output"] == str(regenerated) and regen["server"]["url"] == server.url
    assert regen["identity"]["model_path"] == str(server.model) and regen["identity"]["input_rows"] == len(given)
    sampling = {k: regen["identity"]["sampling"][k] for k in ("max_new_tokens", "temperature")}
    assert sampling == {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    counts = regen["counts"]
    assert (counts["rows_in"], counts["ok"], counts["failed"], counts["skipped"]) == (len(given), len(given), 0, 0)
    assert counts["turns_regenerated"] == turns
    prep = sources["prepare"]
    assert prep["output"] == str(prepared) and prep["settings"]["like"] == fmt
    assert prep["settings"]["input_path"] == str(regenerated.resolve()) and prep["settings"]["input_rows"] == len(given)
    assert (prep["counts"]["rows_in"], prep["counts"]["rows_out"], prep["counts"]["dropped_total"]) == (
        len(given), len(rows), 0)  # fmt: skip

    read = _read_with_the_trainer(fmt, output)
    assert sorted(read) == list(range(len(rows)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(server.model))
    prompts = {(row, meta["turn"]): meta["prompt_tokens"] for row, a in enumerate(answers) for meta in a["regen"]["turns"]}
    for index, row in enumerate(rows):
        sample = read[index]
        assert sample["input_ids"] == row["input_ids"]
        mask = list(row["loss_mask"])
        if fmt == "specforge":
            mask[-1] = 0  # SpecForge's normalizer drops the last position's loss
        assert sample["loss_mask"] == mask
        ids = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        supervised = str(tokenizer.decode(ids, skip_special_tokens=True))
        conversation = answers[row["source_row"]]["conversations"]
        if fmt == "speculators":  # one row per turn: its prompt is the one regenerate sent
            assert mask.index(1) == prompts[(row["source_row"], row["turn"])]
            assert supervised.strip() == conversation[row["turn"]]["value"].strip()
        else:  # one row per conversation, every assistant turn supervised
            assert all(t["value"].strip() in supervised for t in conversation if t["from"] == "gpt")
