"""Row validation: every bad row is a BadSampleError with its reason; good rows are truncated and counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsextract.errors import BadSampleError, ConfigError
from hsextract.extract.planning.dataset import dataset_kind, iter_raw_rows, validate_row


def test_good_row_is_truncated_and_keeps_its_length() -> None:
    sample = validate_row(4, {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}, vocab_size=10, max_seq_len=3)
    assert sample.row == 4 and sample.input_ids == [1, 2, 3] and sample.loss_mask == [0, 1, 1]
    assert sample.original_length == 4 and sample.truncated


def test_loss_mask_defaults_to_all_ones() -> None:
    assert validate_row(0, {"input_ids": [5, 6]}, 10, 8).loss_mask == [1, 1]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([1, 2], "not_object"),
        ({"text": "hi"}, "missing_input_ids"),
        ({"input_ids": []}, "empty_input_ids"),
        ({"input_ids": "1 2"}, "input_ids_not_list"),
        ({"input_ids": [1, 2.5]}, "input_ids_not_integer"),
        ({"input_ids": [1, True]}, "input_ids_not_integer"),
        ({"input_ids": [1, -3]}, "negative_input_ids"),
        ({"input_ids": [1, 10]}, "input_ids_out_of_vocab"),
        ({"input_ids": [1, 2], "loss_mask": [1]}, "loss_mask_length"),
        ({"input_ids": [1, 2], "loss_mask": [1, 2]}, "loss_mask_not_binary"),
        ({"input_ids": [1, 2], "loss_mask": [0, -1]}, "loss_mask_not_binary"),
        ({"input_ids": [1, 2], "loss_mask": [True, 0]}, "loss_mask_not_integer"),
        ({"input_ids": [1, 2], "loss_mask": [1, 1.0]}, "loss_mask_not_integer"),
    ],
)
def test_bad_rows_name_their_reason(raw: object, reason: str) -> None:
    with pytest.raises(BadSampleError) as caught:
        validate_row(7, raw, vocab_size=10, max_seq_len=8)
    assert caught.value.reason == reason and "row 7" in str(caught.value)


def test_jsonl_rows_are_line_numbers_and_a_broken_line_is_one_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"input_ids": [1]}\nnot json\n{"input_ids": [2]}\n')
    rows = list(iter_raw_rows(path))
    assert [row for row, _ in rows] == [0, 1, 2]
    assert isinstance(rows[1][1], BadSampleError)
    assert validate_row(2, rows[2][1], 10, 8).input_ids == [2]


def test_unknown_dataset_names_the_fix(tmp_path: Path) -> None:
    # a path that is no dataset is a bad setting (ConfigError: the CLI exits 2), named with the flag to fix
    with pytest.raises(ConfigError, match=f"dataset {tmp_path / 'missing.jsonl'} does not exist; fix --dataset"):
        dataset_kind(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a\n")
    with pytest.raises(ConfigError, match="unknown extension"):
        dataset_kind(tmp_path / "d.csv")
    with pytest.raises(ConfigError, match=r"not a datasets\.save_to_disk directory"):
        dataset_kind(tmp_path)
