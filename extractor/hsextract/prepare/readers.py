"""The input: conversations in a JSONL file, a Parquet file or a ``datasets.save_to_disk`` directory.

Rows are numbered as ``extract`` numbers them: a JSONL row is its line (0-based; a blank line is a row,
recorded as not JSON, except blank lines at the end); a Parquet or Arrow row is its position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError
from hsextract.prepare.conversation import BadRow, Reason

_BATCH = 512
#: the fields a row's turns are in (``conversation.py``)
_TURN_FIELDS = ("conversations", "messages")


@dataclass(frozen=True)
class InputDataset:
    path: Path
    kind: str  # "jsonl", "parquet" or "arrow"
    split: str | None
    num_rows: int
    fingerprint: str  # sha256 of the file; of the split's Arrow files for a save_to_disk directory

    def iter_rows(self, start: int = 0) -> Iterator[tuple[int, Any]]:
        """(row, record) from row ``start`` on; a JSONL line that is no JSON comes as a :class:`BadRow`."""
        if self.kind == "jsonl":
            return _jsonl_rows(self.path, start)
        if self.kind == "parquet":
            return _parquet_rows(self.path, start)
        return _arrow_rows(self.path, self.split, start)


def _file_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _jsonl_count(path: Path) -> int:
    rows = last_content = 0
    with open(path, "rb") as handle:
        for rows, line in enumerate(handle, 1):
            if line.strip():
                last_content = rows
    return last_content  # blank lines at the end are a trailing newline, not rows


def _jsonl_rows(path: Path, start: int) -> Iterator[tuple[int, Any]]:
    end = _jsonl_count(path)
    with open(path, "rb") as handle:
        for row, line in enumerate(handle):
            if row >= end:
                return
            if row < start:
                continue
            try:
                yield row, json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                what = "is empty" if not line.strip() else f"is not valid JSON ({exc})"
                yield row, BadRow(Reason.NOT_JSON, f"row {row}: line {row + 1} {what}")


def _without_nulls(value: Any) -> Any:
    """``value`` with every None-valued key of its mappings dropped, at any depth."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _turns_as_written(record: dict[str, Any]) -> dict[str, Any]:
    """A Parquet or Arrow row with its turns as its JSONL line gives them.

    A list column has one struct type, the union of every turn's keys: in a column mixing ShareGPT and
    OpenAI turns each ShareGPT turn also comes with ``role`` and ``content`` None (and the reverse), and
    the trainers' normalizations pick a turn's key by presence, so they took the None. A None key is a
    key the turn did not have (Parquet cannot tell them apart), so it is dropped."""
    turns = {name: _without_nulls(record[name]) for name in _TURN_FIELDS if isinstance(record.get(name), list)}
    return {**record, **turns}


def _parquet_rows(path: Path, start: int) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH):
        if row + batch.num_rows <= start:
            row += batch.num_rows
            continue
        for record in batch.to_pylist():
            if row >= start:
                yield row, _turns_as_written(record)
            row += 1


def _load_split(path: Path, split: str | None) -> Any:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many types for a directory it cannot read
        raise ConfigError(
            f"--dataset {path} cannot be loaded with datasets.load_from_disk ({exc}); give a save_to_disk directory, "
            "a .jsonl or a .parquet file"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            given = "needs --split" if split is None else f"has no split {split!r}"
            raise ConfigError(f"--dataset {path} is a DatasetDict and {given}; choose --split from {', '.join(loaded)}")
        return loaded[split]
    if split is not None:
        raise ConfigError(f"--split {split}: --dataset {path} is a single Dataset, not a DatasetDict; drop --split")
    return loaded


def _arrow_rows(path: Path, split: str | None, start: int) -> Iterator[tuple[int, Any]]:
    dataset = _load_split(path, split)
    for first in range(start, len(dataset), _BATCH):
        batch = dataset[first : first + _BATCH]
        columns = list(batch)
        for offset in range(len(batch[columns[0]]) if columns else 0):
            yield first + offset, _turns_as_written({name: batch[name][offset] for name in columns})


def open_input(path: Path, split: str | None = None) -> InputDataset:
    """The input at ``path``, or ConfigError saying what it should be."""
    path = Path(path)
    if path.is_dir():
        dataset = _load_split(path, split)
        files = sorted(Path(f["filename"]) for f in dataset.cache_files)
        return InputDataset(path, "arrow", split, len(dataset), _file_sha256(files))
    if not path.is_file():
        raise ConfigError(f"--dataset {path} does not exist; give a .jsonl or .parquet file or a save_to_disk directory")
    if split is not None:
        raise ConfigError(f"--split {split}: --dataset {path} is a file, not a DatasetDict directory; drop --split")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except Exception as exc:  # pyarrow raises several types for a file it cannot read
            raise ConfigError(f"--dataset {path} is not a readable Parquet file: {exc}") from None
        return InputDataset(path, "parquet", None, rows, _file_sha256([path]))
    if path.suffix == ".jsonl":
        return InputDataset(path, "jsonl", None, _jsonl_count(path), _file_sha256([path]))
    raise ConfigError(f"--dataset {path}: unknown kind {path.suffix!r}; give a .jsonl or .parquet file or a "
                      "save_to_disk directory")
