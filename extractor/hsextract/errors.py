"""The exception tree of hsextract.

    HsextractError            base: every error the CLI prints as ``Type: message``
    ├── ConfigError           a setting is wrong; raised before any work starts
    ├── DatasetError          the dataset as a whole cannot be read
    ├── BadSampleError        one row is unusable; recorded in errors.jsonl and skipped
    ├── ServerError           the server is unreachable, unhealthy or kept failing
    ├── DumpError             a hidden-state dump is missing, malformed or does not match
    ├── DiskSpaceError        not enough free space for the estimated output
    └── OutputError           the output directory is inconsistent (``hsextract verify``)

Every message says what was wrong, with the value, and what to do about it.
"""

from __future__ import annotations


class HsextractError(Exception):
    """Base of every error hsextract raises on purpose."""


class ConfigError(HsextractError):
    """A setting is invalid; nothing has been done yet."""


class DatasetError(HsextractError):
    """The dataset cannot be read at all (missing path, unknown format)."""


class BadSampleError(HsextractError):
    """One dataset row is unusable. ``reason`` is a short machine-readable key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ServerError(HsextractError):
    """The inference server is unreachable, unhealthy, or failing repeatedly."""


class DumpError(HsextractError):
    """A hidden-state dump is missing, malformed, or does not match its request."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DiskSpaceError(HsextractError):
    """The output filesystem has less free space than the run needs."""


class OutputError(HsextractError):
    """An output directory fails verification."""
