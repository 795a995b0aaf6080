"""``fsync``: a file's data, an open handle's, a folder's entries (a rename or a new name is only kept
across a power loss once its folder is synced)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any


def sync_handle(handle: IO[Any]) -> None:
    """What was written through ``handle``, down to the disk."""
    handle.flush()
    os.fsync(handle.fileno())


def sync_file(path: Path) -> None:
    """A closed file's data (one another library wrote: pyarrow, torch), down to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    """A folder's entries: the names created, renamed or removed in it."""
    sync_file(path)


def sync_tree(root: Path) -> None:
    """Every file and folder under ``root`` (a dataset another library wrote: ``datasets.save_to_disk``),
    the folders last, so that once ``root`` is renamed into place all of it is kept."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            sync_file(Path(folder) / name)
        sync_dir(Path(folder))
