"""``fsync``: a file's data, an open handle's, a folder's entries (a rename or a new name is only kept
across a power loss once its folder is synced)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

_enabled = True


@contextlib.contextmanager
def syncs_off() -> Iterator[None]:
    """Every sync a no-op inside the block, for a benchmark that measures what they cost (``bench_durability``,
    ``bench_gpu_e2e --sync-pairs``); nothing a user runs turns them off."""
    global _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = True


def syncs_enabled() -> bool:
    """False inside :func:`syncs_off` (a pack process is told so with each job)."""
    return _enabled


def sync_handle(handle: IO[Any]) -> None:
    """What was written through ``handle``, down to the disk."""
    handle.flush()
    if _enabled:
        os.fsync(handle.fileno())


def sync_fd(fd: int) -> None:
    """What was written through the file descriptor ``fd``, down to the disk."""
    if _enabled:
        os.fsync(fd)


def sync_file(path: Path) -> None:
    """A closed file's data (one another library wrote: pyarrow, torch), down to the disk."""
    if not _enabled:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    """A folder's entries: the names created, renamed or removed in it."""
    sync_file(path)


def sync_dirs(folders: Iterable[Path], *, missing_ok: bool = False) -> None:
    """Each folder once, the deepest first: the names a group of writes made in them. ``missing_ok``: a folder
    that is gone is passed over."""
    for folder in sorted(set(folders), key=lambda f: len(f.parts), reverse=True):
        try:
            sync_dir(folder)
        except FileNotFoundError:
            if not missing_ok:
                raise


def sync_tree(root: Path) -> None:
    """Every file and folder under ``root`` (a dataset another library wrote: ``datasets.save_to_disk``),
    the folders last, so that once ``root`` is renamed into place all of it is kept."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            sync_file(Path(folder) / name)
        sync_dir(Path(folder))
