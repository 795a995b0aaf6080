"""The journal: what a regeneration run has settled, kept beside the output so a killed run resumes.

``OUT.journal/`` holds

- ``identity.json``: what every row is regenerated with (the model's and tokenizer's fingerprints, the
  chat template's sha256, the sampling parameters and stop ids, ``turns``, ``reasoning``, the input's
  fingerprint), written atomically before the first request. A rerun whose identity differs is refused
  (:class:`IdentityMismatchError`, exit 2) naming both values: one output never mixes two settings.
- ``rows.jsonl``: one JSON record per settled row (``ok`` with its output row, ``failed`` or ``skipped``
  with its reason), each appended in one ``write`` and ``fsync``'d before the row counts as done. A
  SIGKILL can tear only the last line; the next run cuts it off and redoes that row. A row is recorded
  at most once per run and only rows not yet settled are sent, so the output gets each row once; a row
  that failed for the server (tries exhausted) is ``retryable`` and a rerun sends it again (its later
  record wins).
- ``errors.jsonl`` and ``summary.json``, written at the end (``writer.py``); ``summary.json`` last, so
  the output is complete exactly when it exists.
- ``extract.lock``: one run per journal (``durable/lock.py``).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes
from hsextract.durable.lock import OutputLock
from hsextract.durable.sync import sync_dir, sync_handle
from hsextract.errors import IdentityMismatchError, OutputError

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity.json"
ROWS_FILE = "rows.jsonl"
ERRORS_FILE = "errors.jsonl"
SUMMARY_FILE = "summary.json"
IDENTITY_VERSION = 1

OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclass(frozen=True)
class RegenIdentity:
    model_path: str  # as the server reports it (informational when a fingerprint is known)
    model_fingerprint: str | None
    tokenizer_fingerprint: str
    chat_template_sha256: str
    sampling: dict[str, Any]  # RegenerateConfig.sampling() plus stop_token_ids
    turns: str
    reasoning: str
    enable_thinking: bool | None
    drop_truncated: bool
    input_path: str
    input_split: str | None
    input_fingerprint: str
    input_rows: int
    # the slice of the input (rows with row % num_shards == shard_index); defaults: a journal of before sharding
    shard_index: int = 0
    num_shards: int = 1
    identity_version: int = IDENTITY_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: Path) -> RegenIdentity:
        try:
            return cls(**data)
        except TypeError as exc:
            raise OutputError(f"{where} is not a regeneration identity of this hsextract ({exc}); restore it or use "
                              "a new --output") from None


#: identity keys a rerun may change: where things lie (the content is compared by fingerprint)
_MOVABLE = ("model_path", "input_path")


def mismatches(recorded: RegenIdentity, current: RegenIdentity) -> list[str]:
    """Each setting that differs, as 'name: journal value (this run: value)'."""
    old, new = recorded.to_json(), current.to_json()
    out = []
    for key, value in old.items():
        if key in _MOVABLE:
            continue
        if key == "model_fingerprint" and (value is None or new[key] is None):
            if value is None and new[key] is None and recorded.model_path != current.model_path:
                out.append(f"model_path {recorded.model_path!r} (this run: {current.model_path!r})")
            continue
        if key == "sampling":
            out.extend(f"{k} {value.get(k)!r} (this run: {new[key].get(k)!r})" for k in sorted(set(value) | set(new[key]))
                       if value.get(k) != new[key].get(k))
            continue
        if value != new[key]:
            out.append(f"{key} {value!r} (this run: {new[key]!r})")
    return out


@dataclass(frozen=True)
class Settled:
    """A settled row as the summary counts it (its whole record stays in rows.jsonl)."""

    status: str
    offset: int  # of its record in rows.jsonl
    retryable: bool
    reason: str | None
    turns: int
    truncated_turns: int
    generated_tokens: int

    @classmethod
    def of(cls, record: dict[str, Any], offset: int) -> Settled:
        return cls(
            str(record["status"]),
            offset,
            bool(record.get("retryable", False)),
            record.get("reason"),
            int(record.get("turns", 0)),
            int(record.get("truncated_turns", 0)),
            int(record.get("generated_tokens", 0)),
        )


class Journal:
    """The journal of one output, locked for this run."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.rows_path = self.directory / ROWS_FILE
        self.settled: dict[int, Settled] = {}
        self._lock = threading.Lock()
        self._file: Any = None
        self._output_lock = OutputLock(self.directory, command="regenerate")

    @classmethod
    def open(cls, directory: Path, identity: RegenIdentity) -> Journal:
        """Take the lock, check or write the identity, read what earlier runs settled."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        journal = cls(directory)
        journal._output_lock.acquire()
        try:
            journal._check_identity(identity)
            journal._read()
            journal._file = open(journal.rows_path, "ab")  # noqa: SIM115 - held for the run, closed in close()
            sync_dir(directory)  # the rows file's name, and the journal folder's own
            sync_dir(directory.parent)
        except BaseException:
            journal._output_lock.release()
            raise
        return journal

    def _check_identity(self, identity: RegenIdentity) -> None:
        path = self.directory / IDENTITY_FILE
        if path.is_file():
            try:
                recorded = RegenIdentity.from_json(json.loads(path.read_text(encoding="utf-8")), path)
            except ValueError:
                raise OutputError(f"{path} is not valid JSON; restore it or use a new --output") from None
            problems = mismatches(recorded, identity)
            if problems:
                raise IdentityMismatchError(
                    f"{self.directory} was started with " + "; ".join(problems) + ". Nothing was sent: one output "
                    "never mixes two settings. Rerun with the journal's settings, or use another --output (or delete "
                    f"{self.directory} to start over)"
                )
            if recorded.model_path != identity.model_path:
                log.info("the model moved from %s to %s (same fingerprint)", recorded.model_path, identity.model_path)
        atomic_write_bytes(path, (json.dumps(identity.to_json(), indent=2, sort_keys=True) + "\n").encode())

    def _read(self) -> None:
        """Index the records; cut a torn last record (a kill mid-write leaves it without its newline:
        each record is one write ending in one)."""
        if not self.rows_path.is_file():
            return
        data = self.rows_path.read_bytes()
        complete = data.rfind(b"\n") + 1  # bytes up to the last newline
        offset = 0
        for number, line in enumerate(data[:complete].split(b"\n")[:-1], 1):
            try:
                record = json.loads(line)
                self.settled[int(record["row"])] = Settled.of(record, offset)
            except (ValueError, KeyError, TypeError) as exc:
                raise OutputError(
                    f"{self.rows_path}: record {number} is damaged ({exc}); restore the file or delete "
                    f"{self.directory} to start over"
                ) from None
            offset += len(line) + 1
        if complete < len(data):
            log.warning("%s: the last record was cut by a kill; its row is done again", self.rows_path)
            with open(self.rows_path, "r+b") as handle:
                handle.truncate(complete)
                sync_handle(handle)

    def done(self, row: int) -> bool:
        """Whether ``row`` needs no request this run (settled, and not a retryable failure)."""
        settled = self.settled.get(row)
        return settled is not None and not settled.retryable

    def append(self, record: dict[str, Any]) -> None:
        """Record one settled row durably (one write, then fsync)."""
        line = (json.dumps(record, ensure_ascii=False, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            offset = self._file.tell()
            self._file.write(line)
            sync_handle(self._file)
            self.settled[int(record["row"])] = Settled.of(record, offset)

    def record(self, row: int) -> dict[str, Any]:
        """The journal record of a settled row (read back from rows.jsonl)."""
        settled = self.settled[row]
        with open(self.rows_path, "rb") as handle:
            handle.seek(settled.offset)
            result: dict[str, Any] = json.loads(handle.readline())
        return result

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._output_lock.release()
