"""The three input kinds, row numbering, resume offsets and the DatasetDict --split rule."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hsextract.errors import ConfigError
from hsextract.prepare.conversation import BadRow, Reason
from hsextract.prepare.readers import open_input

ROWS = [{"id": str(i), "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(5)]


def test_jsonl_rows_blank_and_broken_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    lines = [json.dumps(ROWS[0]), "", "{not json", json.dumps(ROWS[1]), "", ""]
    path.write_text("\n".join(lines) + "\n")
    source = open_input(path)
    assert source.kind == "jsonl" and source.num_rows == 4  # blank lines at the end are no rows
    rows = list(source.iter_rows())
    assert [row for row, _ in rows] == [0, 1, 2, 3]
    assert rows[0][1] == ROWS[0] and rows[3][1] == ROWS[1]
    assert isinstance(rows[1][1], BadRow) and "line 2 is empty" in rows[1][1].message
    assert isinstance(rows[2][1], BadRow) and rows[2][1].reason == Reason.NOT_JSON
    assert [row for row, _ in source.iter_rows(3)] == [3]


def test_parquet_and_resume_offset(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=2)
    source = open_input(path)
    assert (source.kind, source.num_rows) == ("parquet", 5)
    assert [(row, raw["id"]) for row, raw in source.iter_rows(3)] == [(3, "3"), (4, "4")]


def test_save_to_disk_dataset_and_dict(tmp_path: Path) -> None:
    single = tmp_path / "single"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(single))
    source = open_input(single)
    assert (source.kind, source.num_rows) == ("arrow", 5)
    assert [raw["messages"][0]["content"] for _, raw in source.iter_rows(4)] == ["q4"]
    with pytest.raises(ConfigError, match="single Dataset, not a DatasetDict; drop --split"):
        open_input(single, split="train")

    both = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:2])}
                         ).save_to_disk(str(both))
    with pytest.raises(ConfigError, match="DatasetDict and needs --split; choose --split from train, test"):
        open_input(both)
    with pytest.raises(ConfigError, match="has no split 'dev'"):
        open_input(both, split="dev")
    assert open_input(both, split="test").num_rows == 2


def test_fingerprint_follows_content(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n")
    before = open_input(path).fingerprint
    path.write_text(json.dumps(ROWS[1]) + "\n")
    assert open_input(path).fingerprint != before


def test_unknown_kinds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        open_input(tmp_path / "missing.jsonl")
    (tmp_path / "c.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"unknown kind '\.csv'"):
        open_input(tmp_path / "c.csv")
