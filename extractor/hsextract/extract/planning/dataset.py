"""Read tokenized datasets row by row and validate each row.

Formats: JSONL (one JSON object a line), Parquet, and a ``datasets.save_to_disk`` directory
(what speculators' data preparation writes). Rows are numbered by their line or row index,
0-based, so row numbers are stable across runs, resumes and nodes. A bad row never stops a run:
it comes back as a :class:`BadSampleError` with a reason key.

Each row also has a content hash (:func:`iter_rows`): of its line (JSONL, surrounding whitespace
ignored) or of its record as canonical JSON (Parquet, Arrow). The output records it with every
sample, so a resume redoes exactly the rows whose content changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError, ConfigError, DatasetError
from hsextract.output.sample import Sample

RawRow = tuple[int, Any]  # (row, decoded object) or (row, BadSampleError)


@dataclass(frozen=True)
class DatasetRow:
    row: int
    raw: Any  # the decoded object, or a BadSampleError
    digest: str  # content hash: 32 hex digits


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays, tensors (a save_to_disk dataset in torch format)
        return value.tolist()
    return str(value)


def _record_digest(record: Any) -> str:
    return _digest(json.dumps(record, sort_keys=True, separators=(",", ":"), default=_jsonable).encode())


def dataset_kind(path: Path) -> str:
    """The dataset's layout; a path that is no dataset is a bad ``--dataset`` (ConfigError, exit 2)."""
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "arrow"
        raise ConfigError(
            f"dataset directory {path} is not a datasets.save_to_disk directory (no dataset_info.json); "
            "pass a .jsonl or .parquet file or such a directory"
        )
    if not path.exists():
        raise ConfigError(f"dataset {path} does not exist; fix --dataset")
    suffixes = "".join(path.suffixes[-2:]).lower()
    if suffixes.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if suffixes.endswith(".parquet"):
        return "parquet"
    raise ConfigError(f"dataset {path} has an unknown extension; use .jsonl, .parquet or a save_to_disk directory")


def iter_raw_rows(path: Path) -> Iterator[RawRow]:
    """Yield ``(row, object)`` for every row; undecodable rows as ``(row, BadSampleError)``."""
    for item in iter_rows(path):
        yield item.row, item.raw


def iter_rows(path: Path) -> Iterator[DatasetRow]:
    """Every row with its content hash; undecodable rows carry a BadSampleError as ``raw``."""
    path = Path(path)
    kind = dataset_kind(path)
    if kind == "jsonl":
        yield from _iter_jsonl(path)
    elif kind == "parquet":
        for row, record in _iter_parquet(path):
            yield DatasetRow(row, record, _record_digest(record))
    else:
        for row, record in _iter_arrow_dir(path):
            yield DatasetRow(row, record, _record_digest(record))


def iter_row_digests(path: Path) -> Iterator[tuple[int, str]]:
    """Every row's content hash, the same as :func:`iter_rows` gives; JSONL lines are not decoded."""
    path = Path(path)
    if dataset_kind(path) != "jsonl":
        for item in iter_rows(path):
            yield item.row, item.digest
        return
    for row, _, content in _jsonl_lines(path):
        yield row, _digest(content)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes, bytes]]:
    """Every row of a JSONL file: its line and the line's stripped content (empty for a blank line)."""
    blank_rows: list[int] = []  # held back: blank lines at the very end are a trailing newline, not rows
    with open(path, "rb") as handle:
        for row, line in enumerate(handle):
            content = line.strip()
            if not content:
                blank_rows.append(row)
                continue
            for blank in blank_rows:
                yield blank, b"", b""
            blank_rows.clear()
            yield row, line, content


def _iter_jsonl(path: Path) -> Iterator[DatasetRow]:
    for row, line, content in _jsonl_lines(path):
        if not content:
            error = BadSampleError(ErrorReason.EMPTY_LINE, f"row {row}: line {row + 1} is empty")
            yield DatasetRow(row, error, _digest(b""))
        else:
            yield DatasetRow(row, _decode(row, line), _digest(content))


def _decode(row: int, line: bytes) -> Any:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return BadSampleError(ErrorReason.NOT_JSON, f"row {row}: line {row + 1} is not valid JSON ({exc})")


def _iter_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:
        raise DatasetError(f"dataset {path} is not a readable Parquet file: {exc}") from exc
    row = 0
    for batch in parquet.iter_batches(batch_size=256):
        for record in batch.to_pylist():
            yield row, record
            row += 1


def _iter_arrow_dir(path: Path) -> Iterator[RawRow]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DatasetError(f"dataset directory {path} cannot be loaded with datasets.load_from_disk: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DatasetError(f"dataset directory {path} holds splits {list(loaded)} but no 'train'; pass one split")
        loaded = loaded["train"]
    row = 0
    for batch in loaded.iter(batch_size=256):
        columns = list(batch)
        size = len(batch[columns[0]]) if columns else 0
        for index in range(size):
            yield row, {name: batch[name][index] for name in columns}
            row += 1


_NOT_LIST = {"input_ids": ErrorReason.INPUT_IDS_NOT_LIST, "loss_mask": ErrorReason.LOSS_MASK_NOT_LIST}
_NOT_INTEGER = {"input_ids": ErrorReason.INPUT_IDS_NOT_INTEGER, "loss_mask": ErrorReason.LOSS_MASK_NOT_INTEGER}


def _as_int_list(values: Any, row: int, name: str) -> list[int]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, list | tuple):
        raise BadSampleError(_NOT_LIST[name], f"row {row}: {name} is {type(values).__name__}, not a list of integers")
    out = list(values)
    if not set(map(type, out)) <= {int}:  # bool is not a token id either; one pass in C, where a generator was 3 x slower
        bad = next(v for v in out if type(v) is not int)
        raise BadSampleError(_NOT_INTEGER[name], f"row {row}: {name} holds {bad!r}, not an integer")
    return out


def validate_row(row: int, raw: Any, vocab_size: int, max_seq_len: int, require_loss_mask: bool = False) -> Sample:
    """Turn a raw row into a Sample (truncated to ``max_seq_len``) or raise BadSampleError. A row without
    ``loss_mask`` supervises every token, unless ``require_loss_mask`` makes it bad input."""
    if isinstance(raw, BadSampleError):
        raise raw
    if not isinstance(raw, dict):
        raise BadSampleError(
            ErrorReason.NOT_OBJECT, f"row {row}: expected a JSON object with input_ids, got {type(raw).__name__}"
        )
    if raw.get("input_ids") is None:
        raise BadSampleError(
            ErrorReason.MISSING_INPUT_IDS, f"row {row}: no input_ids field; tokenize the dataset first (hsextract prepare)"
        )
    ids = _as_int_list(raw["input_ids"], row, "input_ids")
    if not ids:
        raise BadSampleError(ErrorReason.EMPTY_INPUT_IDS, f"row {row}: input_ids is empty")
    low, high = min(ids), max(ids)
    if low < 0:
        raise BadSampleError(ErrorReason.NEGATIVE_INPUT_IDS, f"row {row}: input_ids holds negative id {low}")
    if high >= vocab_size:
        raise BadSampleError(
            ErrorReason.INPUT_IDS_OUT_OF_VOCAB,
            f"row {row}: input_ids holds id {high}, at or above the model's vocabulary size {vocab_size}; "
            "was it tokenized for another model?",
        )
    mask_raw = raw.get("loss_mask")
    if mask_raw is None:
        if require_loss_mask:
            raise BadSampleError(
                ErrorReason.MISSING_LOSS_MASK,
                f"row {row}: no loss_mask (--require-loss-mask); tokenize with hsextract prepare for assistant-only masks",
            )
        mask = [1] * len(ids)
    else:
        mask = _as_int_list(mask_raw, row, "loss_mask")
        if len(mask) != len(ids):
            raise BadSampleError(
                ErrorReason.LOSS_MASK_LENGTH,
                f"row {row}: loss_mask has {len(mask)} entries but input_ids has {len(ids)}",
            )
        if not set(mask) <= {0, 1}:  # every value is an int by now
            raise BadSampleError(ErrorReason.LOSS_MASK_NOT_BINARY, f"row {row}: loss_mask holds values other than 0 and 1")
    return Sample(
        row=row,
        input_ids=ids[:max_seq_len],
        loss_mask=mask[:max_seq_len],
        original_length=len(ids),
        loss_mask_given=mask_raw is not None,
    )
