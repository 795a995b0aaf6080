"""Paths a command creates (an output, a dump root, a merge target), checked before any work: one that cannot
be created is a :class:`~hsextract.errors.ConfigError` (exit 2) naming the path, what is in the way and the
setting that chooses another, never an ``OSError`` traceback once the work has started."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hsextract.durable.sync import sync_dirs
from hsextract.errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (as anything: a file, a symlink)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _in_the_way(path: Path, exc: OSError | None = None) -> str | None:
    """Why ``path`` cannot be created; None when nothing is seen in the way."""
    path = Path(os.path.abspath(path))
    existing = _nearest_existing(path)
    if existing == path:
        if exc is not None and not path.is_dir():
            return f"{path} exists and is not a directory"
        return None if exc is None else (exc.strerror or str(exc))
    if not existing.is_dir():
        return f"{existing} is a file, not a directory" if existing.is_file() else f"{existing} is not a directory"
    if (exc is not None and exc.errno == errno.EROFS) or not os.access(existing, os.W_OK | os.X_OK):
        reason = "is on a read-only filesystem" if _read_only(existing) else "is not writable by this user"
        return f"{existing} {reason}"
    return None if exc is None else (exc.strerror or str(exc))


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _error(path: Path, what: str, setting: str, reason: str) -> ConfigError:
    return ConfigError(
        f"cannot create {what} {path}: {reason}; nothing was done. Choose a path in a writable directory with {setting}"
    )


def cannot_create(path: Path, what: str, setting: str, exc: OSError) -> ConfigError:
    """The ConfigError of a failed ``mkdir`` of ``path``: what is in the way, and the setting that chooses another."""
    return _error(Path(path), what, setting, _in_the_way(Path(path), exc) or str(exc))


def check_creatable(path: Path, what: str, setting: str) -> None:
    """ConfigError when ``path`` (not there yet) could not be created: a file where a parent directory
    should be, or a parent this user cannot write. A ``path`` that exists is left to the command to judge."""
    reason = _in_the_way(Path(path))
    if reason is not None:
        raise _error(Path(path), what, setting, reason)


def make_directory(path: Path, what: str, setting: str) -> None:
    """``mkdir -p path``, each folder it made synced into its parent (an output whose own name a power loss
    took is lost whole); a ConfigError naming ``what``, ``path`` and ``setting`` when it cannot be made."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        sync_dirs(made.parent for made in missing)
    except OSError as exc:
        raise cannot_create(path, what, setting, exc) from None
