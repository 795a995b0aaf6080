"""The exception tree of hsextract: every error the package raises across a module boundary.

    HsextractError                base: the CLI prints ``Type: message`` and exits non-zero
    ├── ConfigError               a setting is wrong; raised before any work starts
    │   └── MergeError            shards that cannot be merged: they disagree, overlap or leave rows missing
    ├── DatasetError              the dataset as a whole cannot be read
    ├── ServerError               the server is unreachable, unhealthy or kept failing
    │   └── TransientServerError  one failure worth retrying: refused, reset, timeout, HTTP 5xx
    ├── DiskSpaceError            not enough free space for the estimated output
    ├── OutputError               the output directory is inconsistent (``hsextract verify``)
    └── ReasonedError             carries ``reason``, a short key for errors.jsonl and metrics labels
        ├── BadSampleError        one row is unusable; recorded in errors.jsonl and skipped
        ├── BadRequestError       the server refuses one request (the embedded server's HTTP 400)
        └── DumpError             a hidden-state dump is missing, malformed or does not match
            └── LayerMismatchError  the server captures other layers: every further dump would be wrong

Every message says what was wrong, with the value, and what to do about it.
"""

from __future__ import annotations


class HsextractError(Exception):
    """Base of every error hsextract raises on purpose."""


class ConfigError(HsextractError):
    """A setting is invalid; nothing has been done yet."""


class MergeError(ConfigError):
    """Shard outputs that ``hsextract merge`` refuses; nothing has been written yet."""


class DatasetError(HsextractError):
    """The dataset cannot be read at all (missing path, unknown format)."""


class ServerError(HsextractError):
    """The inference server is unreachable, unhealthy, or failing repeatedly."""


class TransientServerError(ServerError):
    """A failure worth retrying: connection refused or reset, timeout, HTTP 5xx."""


class DiskSpaceError(HsextractError):
    """The output filesystem has less free space than the run needs."""


class OutputError(HsextractError):
    """An output directory fails verification."""


class ReasonedError(HsextractError):
    """An error with ``reason``: a short machine-readable key (errors.jsonl, metric labels)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class BadSampleError(ReasonedError):
    """One dataset row is unusable."""


class BadRequestError(ReasonedError):
    """A server refuses one request as malformed (answered with HTTP 400)."""


class DumpError(ReasonedError):
    """A hidden-state dump is missing, malformed, or does not match its request."""


class LayerMismatchError(DumpError):
    """The server captures other layers than configured: every further dump would be wrong too."""
