"""The states the files record, named once: a dump directory's state, a run's status in
``data_config.json``, and the kind of a row in ``errors.jsonl``. Values are the strings on disk."""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    """Prints and formats as its value (as ``enum.StrEnum`` does from Python 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class DumpState(_StrEnum):
    """A dump directory: ``done`` (complete), ``error`` (the writer failed) or still ``pending``."""

    DONE = "done"
    ERROR = "error"
    PENDING = "pending"


class RunStatus(_StrEnum):
    """How an extraction run ended (``data_config.json`` ``status``)."""

    COMPLETE = "complete"  # every row written or recorded as bad input
    INCOMPLETE = "incomplete"  # finished, but some rows failed: a rerun retries them
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: a rerun resumes
    STOPPED = "stopped"  # a fatal stop: fix the cause, then rerun


class ErrorKind(_StrEnum):
    """Why a row is in ``errors.jsonl``."""

    BAD_INPUT = "bad_input"  # the row itself is unusable: skipped for good
    FAILED = "failed"  # it kept failing this run: retried by the next run
