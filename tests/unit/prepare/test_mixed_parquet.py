"""Issue 39 item 5: a Parquet ``conversations`` column mixing ShareGPT and OpenAI turns reads as its JSONL does.

pyarrow gives a list column one struct type: every turn of every row carries ``from``, ``value``, ``role``
and ``content``, the ones it did not have as None."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.readers import open_input
from hsextract.prepare.run import run_prepare

MIXED: list[dict[str, Any]] = [
    {"id": "sharegpt", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {"id": "openai", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                                                            "tool_calls": [{"id": "c1", "type": "function",
                                                                                            "function": {"name": "f"}}]}]},
    {"id": "sharegpt-system", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "x"},
                                                {"from": "gpt", "value": "y"}]},
]


def _write_both(folder: Path) -> tuple[Path, Path]:
    jsonl = folder / "mixed.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in MIXED), encoding="utf-8")
    parquet = folder / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(MIXED), parquet)
    return jsonl, parquet


def test_parquet_and_arrow_turns_keep_only_their_own_keys(tmp_path: Path) -> None:
    _, parquet = _write_both(tmp_path)
    turn_keys = pq.read_table(parquet).schema.field("conversations").type.value_type.names
    assert {"from", "value", "role", "content"} <= set(turn_keys)  # the unified struct this is about
    assert [raw for _, raw in open_input(parquet).iter_rows()] == MIXED
    datasets.Dataset.from_list(MIXED).save_to_disk(str(tmp_path / "arrow"))
    assert [raw for _, raw in open_input(tmp_path / "arrow").iter_rows()] == MIXED


@pytest.mark.parametrize("like", ["specforge", "speculators"])
def test_mixed_parquet_prepares_as_its_jsonl(chatml_model: Path, tmp_path: Path, like: str) -> None:
    jsonl, parquet = _write_both(tmp_path)
    prepared = {}
    for source in (jsonl, parquet):
        out = tmp_path / f"out-{source.suffix[1:]}"
        config = PrepareConfig(model=chatml_model, dataset=source, output=out, like=like, progress=False,
                               specforge_template="qwen" if like == "specforge" else None)
        summary = run_prepare(config)
        assert summary.counts["dropped_total"] == 0, (source, summary.counts["dropped"])
        assert (out / "errors.jsonl").read_text() == ""
        prepared[source.suffix] = datasets.load_from_disk(str(out)).to_list()
    assert prepared[".parquet"] == prepared[".jsonl"]
    assert sorted({row["source_row"] for row in prepared[".parquet"]}) == [0, 1, 2]
