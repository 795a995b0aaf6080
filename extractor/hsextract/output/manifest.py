"""The output's bookkeeping: which rows are written, which were not and why.

``<out>/samples.jsonl``  one line per written sample: row, file, tokens, original length, bytes, the
                        file's checksum, and the content hash of the dataset row it was made from.
``<out>/errors.jsonl``   one line per row not written: row, kind (``bad_input`` or ``failed``), reason,
                        message, row content hash. Bad input is final (for that content); failed
                        rows are retried by the next run.

Both are appended line by line during a run and rewritten sorted by row, atomically, when a run
ends; what is appended is synced in groups by a thread of its own (:meth:`Manifest.sync`, every
:data:`SYNC_INTERVAL_S`): first the folders the new samples were renamed into (each sample file is synced
before its line is appended), then both files. A line can reach the disk before its file's name does (the
kernel writes back when it likes, and lines appended during a group's sync are synced with it): after a
power loss the resume check finds such a file missing and redoes its row. So an
interrupted-then-resumed run leaves the same files an uninterrupted one does. A torn
last line (a crash mid-append) is cut off when the file is opened again, and its row redone; an
append that fails (a full disk) is cut back off before the error goes on. A later line for a row
replaces an earlier one. What a line claims is checked by the run before it is trusted
(``resume_check.py``): the row's content hash, and the file's size and checksum.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hsextract.contract.states import ErrorKind
from hsextract.durable.atomic import atomic_write_bytes
from hsextract.durable.sync import sync_dirs, sync_fd

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
    checksum: str | None = None  # "xxh3-128:<hex>" of the file (checksum.py); None in outputs of older versions
    row_hash: str | None = None  # content hash of the dataset row (dataset.iter_rows)
    loss_mask_given: bool = True  # False: the row had no loss_mask, every token was supervised

    @property
    def truncated(self) -> bool:
        return self.original_length > self.num_tokens


@dataclass(frozen=True)
class ErrorRecord:
    row: int
    kind: ErrorKind
    reason: str
    message: str
    row_hash: str | None = None


@dataclass
class JsonlContent:
    records: list[dict[str, Any]] = field(default_factory=list)
    torn_lines: list[int] = field(default_factory=list)  # 1-based line numbers that are not JSON records


def read_jsonl(path: Path) -> JsonlContent:
    """Every line that is a JSON object with an integer ``row``; the others are reported, not raised."""
    content = JsonlContent()
    if not path.exists():
        return content
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                content.torn_lines.append(number)
                continue
            if isinstance(record, dict) and isinstance(record.get("row"), int):
                content.records.append(record)
            else:
                content.torn_lines.append(number)
    return content


def _from_record(cls: type[Any], record: dict[str, Any]) -> Any:
    return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


def _cut_torn_tail(path: Path) -> None:
    """Drop an unfinished last line, so the next append starts on a line of its own."""
    if not path.exists():
        return
    with open(path, "rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        position = size
        while position > 0:
            step = min(65536, position)
            handle.seek(position - step)
            chunk = handle.read(step)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                position = position - step + newline + 1
                break
            position -= step
        log.warning("%s ends with a torn line (interrupted write): cut off, its row will be redone", path)
        handle.truncate(position)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` with these records, one JSON line each, atomically (temp name, fsync, ``os.replace``)."""
    atomic_write_bytes(path, "".join(json.dumps(record) + "\n" for record in records).encode())


#: how long appended lines and renamed samples may wait for their sync: one group of fsyncs per interval
SYNC_INTERVAL_S = 0.5


def forget_every_row(root: Path) -> None:
    """Empty both files (synced): an output none of whose rows can be trusted any more redoes them all."""
    write_jsonl(Path(root) / SAMPLES_FILE, [])
    write_jsonl(Path(root) / ERRORS_FILE, [])


class _AppendLog:
    """A JSONL file appended one whole line at a time; a failed append is cut back off."""

    def __init__(self, path: Path) -> None:
        _cut_torn_tail(path)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._size = os.fstat(self._fd).st_size

    @staticmethod
    def line(record: dict[str, Any]) -> bytes:
        """A record as its line: encoded before the caller takes its lock, which every row's worker wants."""
        return (json.dumps(record) + "\n").encode()

    def append(self, data: bytes) -> None:
        """Append one whole line (:meth:`line`)."""
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(28, f"No space left on device: only {written} of {len(data)} bytes of a line of {self.path}")
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                log.error("could not cut back a failed append to %s; the next run cuts its torn line", self.path)
            raise
        self._size += len(data)

    def sync(self) -> None:
        sync_fd(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class Manifest:
    """Thread-safe record of written and failed rows of one output directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self.written: dict[int, WrittenSample] = {}
        self.errors: dict[int, ErrorRecord] = {}
        for record in read_jsonl(self.root / SAMPLES_FILE).records:
            try:
                sample = _from_record(WrittenSample, record)
            except TypeError:
                log.warning("%s holds a record that is not a sample of this version: %s", SAMPLES_FILE, record)
                continue
            self.written[sample.row] = sample
        for record in read_jsonl(self.root / ERRORS_FILE).records:
            try:
                error = _from_record(ErrorRecord, record)
                error = replace(error, kind=ErrorKind(error.kind))
            except (TypeError, ValueError):
                log.warning("%s holds a record that is not an error of this version: %s", ERRORS_FILE, record)
                continue
            if error.kind is ErrorKind.BAD_INPUT and error.row not in self.written:
                self.errors[error.row] = error  # failed rows are forgotten: this run retries them
        self._samples_log = _AppendLog(self.root / SAMPLES_FILE)
        self._errors_log = _AppendLog(self.root / ERRORS_FILE)
        self._unsynced_folders: set[Path] = {self.root}  # the two files' own names
        self._syncer: threading.Thread | None = None  # started by the first record (a read-only use needs none)
        self._closing = threading.Event()

    def is_settled(self, row: int, row_hash: str) -> bool:
        """Written, or known bad input, from this very row content: nothing more to do for it."""
        written = self.written.get(row)
        if written is not None:
            return written.row_hash == row_hash
        error = self.errors.get(row)
        return error is not None and error.row_hash == row_hash

    def forget(self, row: int) -> None:
        """Drop what is known of a row (it is redone); its lines go at the next rewrite."""
        with self._lock:
            self.written.pop(row, None)
            self.errors.pop(row, None)

    def add_written(self, sample: WrittenSample) -> None:
        line = _AppendLog.line(asdict(sample))
        with self._lock:
            self._samples_log.append(line)
            self.written[sample.row] = sample
            self.errors.pop(sample.row, None)
            folder = (self.root / sample.file).parent
            while folder != self.root and folder not in self._unsynced_folders:  # a new group folder: its parent too
                self._unsynced_folders.add(folder)
                folder = folder.parent
            self._start_syncer()

    def add_error(self, error: ErrorRecord) -> None:
        line = _AppendLog.line(asdict(error))
        with self._lock:
            self._errors_log.append(line)
            self.errors[error.row] = error
            self._start_syncer()

    def sync(self) -> None:
        """The samples renamed so far (their folders), then both files' appended lines, on the disk."""
        with self._lock:
            folders, self._unsynced_folders = self._unsynced_folders, {self.root}
        sync_dirs(folders, missing_ok=True)  # a record of a file that is not there: the resume redoes it
        self._samples_log.sync()
        self._errors_log.sync()

    def _start_syncer(self) -> None:
        """A thread of its own syncs every SYNC_INTERVAL_S: on a row's path, a slow disk's fsyncs held every worker
        (and the server's dumps, waiting to be taken, filled a small dump tmpfs)."""
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_every_interval, name="hsextract-manifest-sync", daemon=True)
            self._syncer.start()

    def _sync_every_interval(self) -> None:
        while not self._closing.wait(SYNC_INTERVAL_S):
            try:
                self.sync()
            except OSError as exc:  # a full or failing disk: the next sync or the close says it again
                log.warning("syncing %s failed: %s", self.root, exc)

    def close(self) -> None:
        """Rewrite both files sorted by row, atomically. On a full disk the appended files stay
        (they hold the same records, unsorted) and the OSError goes on."""
        self._closing.set()
        if self._syncer is not None:
            self._syncer.join()
        self.sync()  # the folders of the last samples; the rewrite below syncs the files themselves
        with self._lock:
            self._samples_log.close()
            self._errors_log.close()
            write_jsonl(self.root / SAMPLES_FILE, [asdict(self.written[r]) for r in sorted(self.written)])
            write_jsonl(self.root / ERRORS_FILE, [asdict(self.errors[r]) for r in sorted(self.errors)])
