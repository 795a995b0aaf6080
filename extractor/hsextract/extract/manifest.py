"""The output's bookkeeping: which rows are written, which were not and why.

``<out>/samples.jsonl``  one line per written sample: row, file, tokens, original length, bytes.
                        A sample counts as written only once its line is here *and* its file exists.
``<out>/errors.jsonl``   one line per row not written: row, kind (``bad_input`` or ``failed``), reason,
                        message. Bad input is final; failed rows are retried by the next run.

Both are appended line by line during a run (a torn last line after a crash is ignored, and its row
redone) and rewritten sorted by row, atomically, when a run ends; so an interrupted-then-resumed run
leaves the same files an uninterrupted one does.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hsextract.contract.atomic import temp_path
from hsextract.contract.states import ErrorKind

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
ERRORS_FILE = "errors.jsonl"


@dataclass(frozen=True)
class WrittenSample:
    row: int
    file: str
    num_tokens: int
    original_length: int
    bytes: int

    @property
    def truncated(self) -> bool:
        return self.original_length > self.num_tokens


@dataclass(frozen=True)
class ErrorRecord:
    row: int
    kind: ErrorKind
    reason: str
    message: str


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s line %d is torn (interrupted write); its row will be redone", path, number)
                continue
            if isinstance(record, dict) and isinstance(record.get("row"), int):
                records.append(record)
    return records


def _write_jsonl_atomic(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = temp_path(path)
    with open(tmp, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class Manifest:
    """Thread-safe record of written and failed rows of one output directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self.written: dict[int, WrittenSample] = {}
        self.errors: dict[int, ErrorRecord] = {}
        for record in _read_jsonl(self.root / SAMPLES_FILE):
            sample = WrittenSample(**{k: record[k] for k in WrittenSample.__dataclass_fields__})
            if (self.root / sample.file).exists():
                self.written[sample.row] = sample
        for record in _read_jsonl(self.root / ERRORS_FILE):
            try:
                error = ErrorRecord(**{k: record[k] for k in ErrorRecord.__dataclass_fields__})
                error = replace(error, kind=ErrorKind(error.kind))
            except (KeyError, ValueError):
                log.warning("%s holds a record that is not an error of this version: %s", ERRORS_FILE, record)
                continue
            if error.kind is ErrorKind.BAD_INPUT and error.row not in self.written:
                self.errors[error.row] = error  # failed rows are forgotten: this run retries them
        self._samples_handle = open(self.root / SAMPLES_FILE, "a")  # noqa: SIM115 - open for the whole run, closed in close()
        self._errors_handle = open(self.root / ERRORS_FILE, "a")  # noqa: SIM115 - as above

    def is_settled(self, row: int) -> bool:
        """Written, or known bad input: nothing more to do for this row."""
        return row in self.written or row in self.errors

    def add_written(self, sample: WrittenSample) -> None:
        with self._lock:
            self.written[sample.row] = sample
            self.errors.pop(sample.row, None)
            self._samples_handle.write(json.dumps(asdict(sample)) + "\n")
            self._samples_handle.flush()

    def add_error(self, error: ErrorRecord) -> None:
        with self._lock:
            self.errors[error.row] = error
            self._errors_handle.write(json.dumps(asdict(error)) + "\n")
            self._errors_handle.flush()

    def close(self) -> None:
        """Rewrite both files sorted by row, atomically."""
        with self._lock:
            self._samples_handle.close()
            self._errors_handle.close()
            _write_jsonl_atomic(self.root / SAMPLES_FILE, [asdict(self.written[r]) for r in sorted(self.written)])
            _write_jsonl_atomic(self.root / ERRORS_FILE, [asdict(self.errors[r]) for r in sorted(self.errors)])
