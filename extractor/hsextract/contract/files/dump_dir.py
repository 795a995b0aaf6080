"""Dump directories are untrusted input: the dump root and everything in it is opened without
following symlinks.

The server side (the SGLang hook and the embedded server, through ``DumpSink``) creates the dump
root with mode 0700, or accepts an existing one only when it is a real directory owned by the
server's user and writable by nobody else (:func:`prepare_dump_root`): a root another user made
in a world-writable ``/dev/shm`` would let that user plant or swap dumps. The extractor refuses a
root that is a symlink or group/world-writable (:func:`check_dump_root`).

Inside the root, a request's directory and its files are opened relative to directory file
descriptors with ``O_NOFOLLOW`` (:func:`open_request_dir`, :func:`open_file`): a symlink named like a
request id is never written through nor read from; the writer replaces it with a real directory,
the reader refuses it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import stat
from pathlib import Path

from hsextract.contract.states import ErrorReason
from hsextract.errors import ConfigError, DumpError, UnsafeDumpDirError
from hsextract.paths import cannot_create

log = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
#: how a user chooses another dump root
DUMP_DIR_SETTING = "--dump-dir (dump_dir in a --config file)"
#: not writable by group or others
_FOREIGN_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _lstat_root(path: Path) -> os.stat_result:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(
            f"dump dir {path} does not exist; start the server first (it creates it), and give the extractor "
            "the directory the server writes to (same host, same /dev/shm)"
        ) from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDumpDirError(
            f"dump dir {path} is a symlink (to {os.readlink(path)}); dumps are never read or written through "
            "symlinks: pass the real directory as dump_dir"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDumpDirError(f"dump dir {path} exists and is not a directory; remove it or choose another dump_dir")
    return st


def _refuse_foreign_writers(path: Path, st: os.stat_result) -> None:
    if st.st_mode & _FOREIGN_WRITE:
        raise UnsafeDumpDirError(
            f"dump dir {path} has mode {stat.S_IMODE(st.st_mode):04o}: writable by group or others, who could plant "
            f"or replace dumps; run chmod 700 {path} (or remove it and let the server create it)"
        )


def prepare_dump_root(path: Path) -> Path:
    """Server side: create the dump root with mode 0700, or check an existing one.

    Refuses (:class:`UnsafeDumpDirError`) a symlink, a non-directory, a directory owned by another
    user, or one writable by group or others."""
    path = Path(path)
    if not os.path.lexists(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file where a parent should be, a read-only filesystem: the path and the fix
            raise cannot_create(path, "dump dir", DUMP_DIR_SETTING, exc) from None
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile by someone else: the checks below decide
            pass
        except OSError as exc:
            raise cannot_create(path, "dump dir", DUMP_DIR_SETTING, exc) from None
    st = _lstat_root(path)
    if st.st_uid != os.geteuid():
        raise UnsafeDumpDirError(
            f"dump dir {path} belongs to {_user(st.st_uid)}, not to this server's user {_user(os.geteuid())}: whoever "
            f"owns it can plant or replace dumps. Remove it (rm -rf {path}) so the server creates it with mode 0700, "
            "or choose another dump_dir"
        )
    _refuse_foreign_writers(path, st)
    return path


def check_dump_root(path: Path) -> Path:
    """Extractor side: the root must be a real directory that only its owner can write."""
    path = Path(path)
    _refuse_foreign_writers(path, _lstat_root(path))
    return path


def _unsafe(path: Path, what: str) -> DumpError:
    return DumpError(
        ErrorReason.UNSAFE_DUMP,
        f"{path} is {what}; dumps are never read through symlinks or from anything but a directory the "
        "server made. Something other than the server writes into the dump root: find it (ls -la "
        f"{path.parent}) and remove it",
    )


def open_request_dir(directory: Path, create: bool = False) -> int | None:
    """Open ``<root>/<rid>`` without following symlinks; return its descriptor, or None when it
    does not exist (and ``create`` is false).

    With ``create`` (the writer), a missing directory is made with mode 0700, and a symlink or
    file in its place is removed (never followed) and replaced; a directory owned by another user
    is refused. Without it (the reader), anything but a real directory that only its owner can
    write raises ``DumpError`` ``unsafe_dump``."""
    root_fd = os.open(directory.parent, DIR_FLAGS)
    try:
        return _open_request_dir_at(root_fd, directory, create)
    finally:
        os.close(root_fd)


def _open_request_dir_at(root_fd: int, directory: Path, create: bool) -> int | None:
    name = directory.name
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=root_fd)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        what = "a symlink" if stat.S_ISLNK(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode) else "not a directory"
        if not create:
            raise _unsafe(directory, what) from None
        log.warning("%s was %s: removed (not followed) and replaced by a directory", directory, what)
        os.unlink(name, dir_fd=root_fd)
        os.mkdir(name, 0o700, dir_fd=root_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    st = os.fstat(fd)
    problem = None
    if create and st.st_uid != os.geteuid():
        problem = f"a directory of {_user(st.st_uid)}, not of this server's user"
    elif st.st_mode & _FOREIGN_WRITE:
        problem = f"a directory with mode {stat.S_IMODE(st.st_mode):04o} (writable by group or others)"
    if problem is not None:
        os.close(fd)
        raise _unsafe(directory, problem)
    return fd


def request_dir_exists(directory: Path) -> bool:
    """Whether ``<root>/<rid>`` is there (one ``lstat``); DumpError ``unsafe_dump`` for a symlink or file in its place."""
    try:
        mode = os.lstat(directory).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise _unsafe(directory, "a symlink" if stat.S_ISLNK(mode) else "not a directory")
    return True


def read_whole(fd: int) -> bytes:
    """A small file's bytes from its descriptor (at its offset): plain ``read`` calls, no file object around it."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def open_file(dir_fd: int, name: str, where: Path) -> int | None:
    """Open a regular file in a request directory without following symlinks; None when missing."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unsafe(where / name, "a symlink") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unsafe(where / name, "not a regular file")
    return fd


def is_regular_file(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def fd_path(fd: int, name: str = "") -> str:
    """A path that resolves to exactly the open file or directory ``fd`` (Linux ``/proc``), for
    libraries that take a path (safetensors): no component of it can be swapped for a symlink."""
    base = f"/proc/self/fd/{fd}"
    return f"{base}/{name}" if name else base
