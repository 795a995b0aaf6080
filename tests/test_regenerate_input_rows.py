"""Issue 39: ``regenerate`` on inputs a new user brings: a Parquet column mixing ShareGPT and OpenAI turns
(item 5), a conversation with no assistant turn to regenerate and the rerun of a complete output (item 11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_conversations

from .regen_server import FakeSGLang, write_rows

MIXED: list[dict[str, Any]] = [
    {"id": "sharegpt", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {"id": "openai", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
]
NO_ASSISTANT = {"id": "no-assistant", "messages": [{"role": "user", "content": "only a question"}]}


def _regenerate(fake: FakeSGLang, dataset: Path, output: Path) -> list[str]:
    return ["regenerate", "--server", fake.url, "--dataset", str(dataset), "--output", str(output), "--no-progress"]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _good_rows(tmp_path: Path, count: int) -> list[dict[str, Any]]:
    return _lines(make_sample_conversations(tmp_path / "good.jsonl", count, 10))


def test_mixed_parquet_regenerates_as_its_jsonl(fake: FakeSGLang, tmp_path: Path, capsys: Any) -> None:
    jsonl = write_rows(tmp_path / "mixed.jsonl", MIXED)
    parquet = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(MIXED), parquet)
    assert main(_regenerate(fake, jsonl, tmp_path / "from-jsonl.jsonl")) == 0
    code = main(_regenerate(fake, parquet, tmp_path / "from-parquet.jsonl"))
    assert code == 0, capsys.readouterr().err  # was a KeyError: None traceback
    out = _lines(tmp_path / "from-parquet.jsonl")
    assert out == _lines(tmp_path / "from-jsonl.jsonl")
    assert [set(turn) for turn in out[0]["conversations"]] == [{"from", "value"}] * 2  # each turn its own keys


def test_a_conversation_without_assistant_turn_is_bad_input_not_a_failure(fake: FakeSGLang, tmp_path: Path,
                                                                           capsys: Any) -> None:
    good = _good_rows(tmp_path, 2)
    dataset = write_rows(tmp_path / "in.jsonl", [good[0], NO_ASSISTANT, good[1]])
    output = tmp_path / "out.jsonl"
    assert main(_regenerate(fake, dataset, output)) == 0  # a rerun cannot fix it: no exit 3
    captured = capsys.readouterr()
    assert "COMPLETE" in captured.out and "ok 2, failed 0 (none), skipped 1 (no assistant turn 1)" in captured.out
    assert "rerun" not in captured.err and "retried" not in captured.err
    errors = _lines(tmp_path / "out.jsonl.journal" / "errors.jsonl")
    assert [(e["row"], e["id"], e["reason"]) for e in errors] == [(1, "no-assistant", "no assistant turn")]
    assert [row["id"] for row in _lines(output)] == [good[0]["id"], good[1]["id"]]


def test_a_rerun_of_a_complete_output_counts_every_row_as_done_before(fake: FakeSGLang, tmp_path: Path,
                                                                      capsys: Any) -> None:
    args = _regenerate(fake, write_rows(tmp_path / "in.jsonl", _good_rows(tmp_path, 3)), tmp_path / "o.jsonl")
    assert main(args) == 0
    assert "; 0 were done by an earlier run" in capsys.readouterr().out
    assert main(args) == 0
    again = capsys.readouterr().out
    assert "ALREADY COMPLETE" in again and "; 3 were done by an earlier run" in again


def test_the_pipeline_says_which_rows_regenerate_left_out(fake: FakeSGLang, model_dir: Any, start_server: Any,
                                                          tmp_path: Path, capsys: Any) -> None:
    model = model_dir()
    fake.model_path = str(model)
    server = start_server(model)
    good = _good_rows(tmp_path, 2)
    dataset = write_rows(tmp_path / "in.jsonl", [good[0], NO_ASSISTANT, good[1]])
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "regenerate": {"server": fake.url, "dataset": str(dataset), "output": str(tmp_path / "regen.jsonl"),
                       "max_new_tokens": 8, "progress": False},
        "prepare": {"model": str(model), "output": str(tmp_path / "prepared"), "progress": False,
                    "specforge_template": "kimi-k2-instruct"},
        "extract": {"server": server.url, "output": str(tmp_path / "out"), "health_timeout_s": 30},
    }))  # fmt: skip
    journal = tmp_path / "regen.jsonl.journal"
    for _ in ("run", "rerun: every step already complete"):
        assert main(["pipeline", "--config", str(path)]) == 0
        printed = capsys.readouterr().out
        assert "PIPELINE COMPLETE" in printed
        assert f"regenerate left 1 of 3 rows out (no assistant turn 1): see {journal / 'errors.jsonl'}" in printed
        assert "prepare left" not in printed  # it dropped none of the 2 it was given
