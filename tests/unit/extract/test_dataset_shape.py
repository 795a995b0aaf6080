"""What extract refuses before any request: a dataset of conversations, and rows without loss_mask when they
are required. The server URL points at a closed port: the refusal must come before the health wait."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hsextract.cli import main
from hsextract.extract.planning.dataset_shape import read_shape


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SHAREGPT = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
MESSAGES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.mark.parametrize("row", [SHAREGPT, MESSAGES], ids=["sharegpt", "messages"])
def test_a_dataset_of_conversations_is_refused_naming_prepare(row, tmp_path: Path, capsys) -> None:
    dataset = _write(tmp_path / "conversations.jsonl", [row] * 3)
    out = tmp_path / "out"
    code = main(["extract", "--server", _closed_port_url(), "--dataset", str(dataset), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "holds conversations" in err and "hsextract prepare --model MODEL_DIR" in err and str(dataset) in err
    assert not (out / "identity.json").exists() and not (out / "samples.jsonl").exists()


def test_rows_without_loss_mask_are_refused_up_front_when_required(tmp_path: Path, capsys) -> None:
    dataset = _write(tmp_path / "ids.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5], "loss_mask": [0, 1]}])
    args = ["extract", "--server", _closed_port_url(), "--dataset", str(dataset), "--output", str(tmp_path / "out")]
    assert main([*args, "--require-loss-mask", "--health-timeout-s", "0"]) == 2
    err = capsys.readouterr().err
    assert "1 of the first 2 rows have no loss_mask" in err and "--require-loss-mask" in err


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_a_dataset_without_rows_is_refused_as_prepare_refuses_it(content: str, tmp_path: Path, capsys) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(content)
    out = tmp_path / "out"
    code = main(["extract", "--server", _closed_port_url(), "--dataset", str(dataset), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"dataset {dataset} has no rows (it is empty, or holds only blank lines)" in err
    assert "COMPLETE" not in err and not out.exists()


def test_shape_counts_the_first_rows(tmp_path: Path) -> None:
    dataset = _write(tmp_path / "mixed.jsonl", [SHAREGPT, {"input_ids": [1]}, {"input_ids": [2], "loss_mask": [1]}, [1]])
    shape = read_shape(dataset)
    assert (shape.rows_read, shape.with_input_ids, shape.conversations, shape.without_loss_mask) == (3, 2, 1, 1)
    assert shape.rows == 4
