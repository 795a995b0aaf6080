"""The exception tree of hsextract: every error the package raises across a module boundary.

    HsextractError                base: the CLI prints ``Type: message`` and exits non-zero
    ├── ConfigError               a setting is wrong; raised before any work starts
    │   ├── IdentityMismatchError the output was started with another model, layers, dataset, ...
    │   ├── UnsafeDumpDirError    a dump root that is a symlink, another user's, or writable by others
    │   └── MergeError            shards that cannot be merged: they disagree, overlap or leave rows missing
    ├── DatasetError              the dataset as a whole cannot be read
    ├── GatherError               a shard's output could not be copied from its host (``hsextract merge --inventory``)
    ├── ServerError               the server is unreachable, unhealthy or kept failing
    │   ├── TransientServerError  one failure worth retrying: refused, reset, timeout, HTTP 5xx
    │   │   ├── ServerUnreachableError  no connection at all: the server is down or restarting
    │   │   └── RidInUseError     the server still holds an earlier request of this rid (HTTP 400)
    │   ├── WrongServerError      not an SGLang endpoint (401/403/404/405, HTML): never retried
    │   └── SpotCheckUnavailableError  --spot-check-every is on, the server returns no hidden states
    ├── DiskSpaceError            not enough free space for the estimated output
    │   └── DiskFullError         the output or dump filesystem filled up during the run
    ├── OutputError               the output directory is inconsistent (``hsextract verify``)
    │   └── OutputLockedError     another extractor is writing this output
    └── ReasonedError             carries ``reason``, a short key for errors.jsonl and metrics labels
        ├── BadSampleError        one row is unusable; recorded in errors.jsonl and skipped
        ├── BadRequestError       the server refuses one request (the embedded server's HTTP 400)
        └── DumpError             a hidden-state dump is missing, malformed or does not match
            ├── LayerMismatchError  the server captures other layers: every further dump would be wrong
            ├── ModelMismatchError  the dump comes from another model than the output's
            ├── StorageMismatchError the dump is stored as FP8 and the output is not, or the reverse
            ├── PackProcessError  the process packing the row ended (killed, out of memory): retried
            └── SpotCheckMismatchError the engine's own states of a row differ from its dump

Every message says what was wrong, with the value, and what to do about it.

What one row's failure means for the run is carried by the class, not by a list elsewhere:
``fatal`` errors stop the run at once (every further request would fail the same way: another
model or layer set, not an SGLang server, a full disk); ``retryable`` ones are tried again up to
``max_attempts`` (a dropped connection, a missing or malformed dump); a :class:`BadSampleError` is
recorded and skipped. Every error pickles whole (a pack process's comes back to the row's thread).
"""

from __future__ import annotations

from typing import Any, ClassVar

from hsextract.contract.states import ErrorReason


class HsextractError(Exception):
    """Base of every error hsextract raises on purpose."""

    #: one row hit it, and every further row would too: the run stops
    fatal: ClassVar[bool] = False
    #: worth another try of the same row
    retryable: ClassVar[bool] = False


class ConfigError(HsextractError):
    """A setting is invalid; nothing has been done yet."""


class MergeError(ConfigError):
    """Shard outputs that ``hsextract merge`` refuses; nothing has been written yet."""


class DatasetError(HsextractError):
    """The dataset cannot be read at all (missing path, unknown format)."""


class GatherError(HsextractError):
    """A shard's output could not be copied from its host (ssh, rsync or tar failed, or it holds no output)."""


class ServerError(HsextractError):
    """The inference server is unreachable, unhealthy, or failing repeatedly."""


class TransientServerError(ServerError):
    """A failure worth retrying: connection refused or reset, timeout, HTTP 5xx."""

    retryable = True


class ServerUnreachableError(TransientServerError):
    """No connection could be made: the server is down or restarting. The run waits for it to come
    back (up to ``health_timeout_s``) instead of spending the row's tries."""


class RidInUseError(TransientServerError):
    """The server still holds an earlier request of this rid (SGLang's HTTP 400 "Duplicate request
    ID"): the earlier request was cancelled or is unfinished. Sent again once the server lets go."""


class WrongServerError(ServerError):
    """The URL answers, but not as an SGLang server would (auth wall, proxy page, wrong path)."""

    fatal = True


class SpotCheckUnavailableError(ServerError):
    """The spot check asked for the engine's own hidden states and the server returned none."""

    fatal = True


class IdentityMismatchError(ConfigError):
    """The output holds samples of another model, layer set, dataset or setting than this run's."""


class UnsafeDumpDirError(ConfigError):
    """A dump root that someone else could write into: a symlink, another user's, or group/world-writable."""


class DiskSpaceError(HsextractError):
    """The output filesystem has less free space than the run needs."""


class DiskFullError(DiskSpaceError):
    """A filesystem the run writes to (the output, or the server's dump root) is full."""

    fatal = True


class OutputError(HsextractError):
    """An output directory fails verification."""


class OutputLockedError(OutputError):
    """Another extractor holds the output's lock."""


class ReasonedError(HsextractError):
    """An error with ``reason``: a short machine-readable key (errors.jsonl, metric labels)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as (reason, message), not Exception's (message,): a pack process's error reaches the run whole
        return _rebuild_reasoned, (type(self), self.reason, str(self))


def _rebuild_reasoned(cls: type[ReasonedError], reason: str, message: str) -> ReasonedError:
    """An unpickled :class:`ReasonedError`, whatever its subclass's constructor takes (``reason`` set after)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.reason = reason
    return error


class BadSampleError(ReasonedError):
    """One dataset row is unusable."""

    def __init__(self, reason: ErrorReason, message: str) -> None:
        super().__init__(reason, message)
        self.reason: ErrorReason = reason


class BadRequestError(ReasonedError):
    """A server refuses one request as malformed (answered with HTTP 400)."""


class DumpError(ReasonedError):
    """A hidden-state dump is missing, malformed, or does not match its request."""

    retryable = True

    def __init__(self, reason: ErrorReason, message: str) -> None:
        super().__init__(reason, message)
        self.reason: ErrorReason = reason


class LayerMismatchError(DumpError):
    """The server captures other layers than configured: every further dump would be wrong too."""

    fatal = True
    retryable = False


class ModelMismatchError(DumpError):
    """A dump was written by another model than the output's (the server was restarted on another checkpoint)."""

    fatal = True
    retryable = False


class StorageMismatchError(DumpError):
    """A dump's storage (FP8 or the model's dtype) is not the output's: the server is configured for the
    other one, so every further dump would be too."""

    fatal = True
    retryable = False


class PackProcessError(DumpError):
    """A pack process ended (killed, out of memory) while it packed a row: the row is tried again in a new one."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorReason.PACK_PROCESS_ENDED, message)


class SpotCheckMismatchError(DumpError):
    """The engine's own hidden states of a spot-checked row differ from what its dump holds. The row is
    not written (a rerun redoes it); after ``spot_check_max_mismatches`` of them the run stops."""

    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(ErrorReason.SPOT_CHECK_MISMATCH, message)
