"""Writes that are never visible half-done nor lost once done: a temp name beside the target, synced,
then ``os.replace``, then (for one file) its folder synced.

Every temp file the package writes is named by :func:`temp_path`; safetensors' ``save_file`` (0.8) writes
through a ``.tmpXXXXXX`` of its own (Rust's tempfile crate) in the target's folder and renames it to that
name. So a run killed mid-write leaves only names :func:`is_temp_name` recognises, which the next run sweeps
and ``verify`` reports. A write that fails (a full disk) removes its temp file before the error goes on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading
from pathlib import Path

from hsextract.durable.sync import sync_dir, sync_file, sync_handle

_TEMP_NAME_RE = re.compile(r"^\..+\.tmp-\d+(-\d+)?$")
#: what safetensors' save_file writes first (Rust's tempfile crate: ".tmp" and 6 letters or digits)
_WRITER_TEMP_NAME_RE = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: what the writers we call (torch's zip writer, safetensors' Rust writer, the OS) say on a full disk
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "StorageFull", "os error 28")


def temp_path(path: Path) -> Path:
    """A hidden sibling of ``path``, unique per process and thread."""
    return path.with_name(temp_name(path.name))


def temp_name(name: str) -> str:
    """:func:`temp_path`'s name for a file called ``name``."""
    return f".{name}.tmp-{os.getpid()}-{threading.get_ident()}"


def is_temp_name(name: str) -> bool:
    return _TEMP_NAME_RE.match(name) is not None or _WRITER_TEMP_NAME_RE.match(name) is not None


def sweep_temp_files(root: Path) -> int:
    """Remove the temp files a killed writer left under ``root`` (never under a final name); how many."""
    removed = 0
    for path in list(root.rglob(".*")):
        if is_temp_name(path.name) and path.exists():  # (a temp directory's own files went with it)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
    return removed


def remove_quietly(path: Path) -> None:
    """Remove a temp file after a failed write; a failure here must not hide the first one."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes, *, sync_folder: bool = True) -> None:
    """``data`` at ``path``, whole or not at all, and on the disk when this returns: the file is synced before
    the rename and its folder after it. ``sync_folder=False`` leaves the folder to the caller (one sync for a
    group of files written into it)."""
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            sync_handle(handle)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    if sync_folder:
        sync_dir(path.parent)


def replace_synced(tmp: Path, path: Path) -> None:
    """Move a file another writer made (torch, safetensors, pyarrow) into place, its data synced first; its
    folder is the caller's to sync (a group of renames at a time)."""
    sync_file(tmp)
    os.replace(tmp, path)


def disk_full_text(text: str) -> bool:
    """Whether an error message (e.g. a dump's ``error`` marker) says a filesystem is full."""
    return any(marker in text for marker in _DISK_FULL_TEXTS)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it: torch wraps the OSError in a RuntimeError) is a full disk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if disk_full_text(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False
