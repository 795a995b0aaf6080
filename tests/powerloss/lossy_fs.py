"""A FUSE filesystem that loses what was not fsynced when told to: the tests' stand-in for LazyFS.

LazyFS (the usual tool for this) is packaged by neither Debian nor PyPI; this is a small in-memory
model of the same idea on libfuse3 through ``mfusepy``. Every inode exists in two states:

* LIVE: what processes see. Every write, truncate, create, mkdir, rename, unlink, rmdir, link and
  symlink changes LIVE only. ``flush`` (close) is not a sync.
* DURABLE: what survives a power cut. ``fsync``/``fdatasync`` of a file copies that inode's LIVE
  content and size to DURABLE; ``fsync`` of a directory (FUSE's ``fsyncdir``) copies that
  directory's LIVE entries (name -> inode). An inode that is named by a durable entry but was never
  synced itself is durable empty: a file reads back 0 bytes (as on ext4), a directory has no entries.
  The mount's root directory is durable from the start. A file unlinked while open lives on under a
  hidden name (libfuse's ``.fuse_hidden*``) until closed: such names are not listed and never durable.

Control requests (one line each over the Unix socket given by ``--control``; a one-line JSON reply):

* ``cut``: the power cut. LIVE := a copy of DURABLE, keeping only what the durable root reaches; file
  handles opened before it fail with EIO afterwards (kill the writers first).
* ``persist N``: the kernel wrote some things back early: every LIVE regular file of at most N bytes
  becomes durable, and so do the LIVE entries of every directory (larger files keep their last
  durable content, or none). ``persist_all``: everything (a clean shutdown).
* ``stats``: counts of what a cut would lose now; ``ping``: liveness.

Kernel caches are kept honest for cuts: entry, attribute and negative timeouts are 0, writeback
caching and kernel_cache are off (so mmap readers and every open see the LIVE data), and locks are
left to the kernel's local locking (no lock ops here). Run: ``lossy_fs.py MOUNTPOINT --control SOCKET``
(foreground; SIGTERM unmounts).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy would take libfuse2 where both are installed
from mfusepy import FUSE, FuseOSError, Operations, fuse_get_context, fuse_version_major  # type: ignore[import-untyped]

ROOT_INO = 1
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
RENAME_NOREPLACE = 1
HIDDEN_PREFIX = ".fuse_hidden"  # libfuse renames a file unlinked while open to such a name until it is closed
BLOCK = 4096
FREE_BYTES = 100 << 30  # statfs reports this much free, so disk-space preflights pass


@dataclass
class Inode:
    ino: int
    mode: int
    uid: int = 0
    gid: int = 0
    nlink: int = 0
    data: bytearray = field(default_factory=bytearray)  # regular file content
    entries: dict[str, int] = field(default_factory=dict)  # directory: name -> inode number
    target: str = ""  # symlink
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    unsynced_from: int | None = 0  # file: LIVE may differ from DURABLE from this offset on; None: in sync
    entries_unsynced: bool = True  # directory: LIVE entries may differ from DURABLE ones
    open_count: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    def snapshot(self, with_content: bool) -> Inode:
        """A copy for the other state; without content it is the durable-but-never-synced inode (empty)."""
        return dataclasses.replace(
            self,
            data=bytearray(self.data) if with_content else bytearray(),
            entries=self.names() if with_content else {},
            open_count=0,
        )

    def copy_metadata_to(self, other: Inode) -> None:
        other.mode, other.uid, other.gid = self.mode, self.uid, self.gid
        other.atime_ns, other.mtime_ns, other.ctime_ns = self.atime_ns, self.mtime_ns, self.ctime_ns

    def touch(self) -> None:
        self.mtime_ns = self.ctime_ns = time.time_ns()

    def mark_changed(self, offset: int) -> None:
        self.unsynced_from = offset if self.unsynced_from is None else min(self.unsynced_from, offset)
        self.touch()

    def names(self) -> dict[str, int]:
        """The entries but libfuse's hidden names of unlinked open files (never listed, never durable)."""
        return {name: ino for name, ino in self.entries.items() if not name.startswith(HIDDEN_PREFIX)}

    def mark_entries_changed(self) -> None:
        self.entries_unsynced = True
        self.touch()


@dataclass
class Handle:
    ino: int
    append: bool


class Tree:
    """The two states and the rules between them; callers hold ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        now = time.time_ns()
        root = Inode(ROOT_INO, stat.S_IFDIR | 0o755, os.getuid(), os.getgid(), 2, atime_ns=now, mtime_ns=now, ctime_ns=now)
        root.entries_unsynced = False
        self.live: dict[int, Inode] = {ROOT_INO: root}
        self.durable: dict[int, Inode] = {ROOT_INO: root.snapshot(with_content=True)}
        self.handles: dict[int, Handle] = {}
        self.next_ino = ROOT_INO + 1
        self.next_fh = 1
        self.cuts = 0

    # -- names ----------------------------------------------------------------------------------------
    def lookup(self, path: str) -> Inode:
        node = self.live[ROOT_INO]
        for part in path.split("/"):
            if not part:
                continue
            if not node.is_dir:
                raise FuseOSError(errno.ENOTDIR)
            child = node.entries.get(part)
            if child is None:
                raise FuseOSError(errno.ENOENT)
            node = self.live[child]
        return node

    def parent_of(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self.lookup(head or "/")
        if not parent.is_dir:
            raise FuseOSError(errno.ENOTDIR)
        return parent, name

    def add_new(self, parent: Inode, name: str, mode: int) -> Inode:
        """A new inode of ``mode`` under ``parent`` as ``name`` (EEXIST if the name is taken)."""
        if name in parent.entries:
            raise FuseOSError(errno.EEXIST)
        uid, gid, _pid = fuse_get_context()
        now = time.time_ns()
        node = Inode(self.next_ino, mode, uid, gid, atime_ns=now, mtime_ns=now, ctime_ns=now)
        self.next_ino += 1
        self.live[node.ino] = node
        self.add_entry(parent, name, node)
        return node

    def add_entry(self, parent: Inode, name: str, node: Inode) -> None:
        if name in parent.entries:
            raise FuseOSError(errno.EEXIST)
        parent.entries[name] = node.ino
        if node.is_dir:
            parent.nlink += 1
            node.nlink = 2
        else:
            node.nlink += 1
        node.ctime_ns = time.time_ns()
        parent.mark_entries_changed()

    def remove(self, path: str, directory: bool) -> None:
        node = self.lookup(path)
        if node.is_dir != directory:
            raise FuseOSError(errno.EISDIR if node.is_dir else errno.ENOTDIR)
        if node.names():
            raise FuseOSError(errno.ENOTEMPTY)
        self.remove_entry(*self.parent_of(path))

    def remove_entry(self, parent: Inode, name: str) -> None:
        node = self.live[parent.entries.pop(name)]
        if node.is_dir:
            parent.nlink -= 1
            node.nlink = 0
            for hidden in list(node.entries):  # an empty directory may still hold unlinked open files
                self.remove_entry(node, hidden)
        else:
            node.nlink -= 1
        node.ctime_ns = time.time_ns()
        parent.mark_entries_changed()
        self.release_if_unused(node)

    def release_if_unused(self, node: Inode) -> None:
        if node.nlink == 0 and node.open_count == 0:
            self.live.pop(node.ino, None)

    def rename(self, old: str, new: str, flags: int) -> None:
        src_parent, src_name = self.parent_of(old)
        if src_name not in src_parent.entries:
            raise FuseOSError(errno.ENOENT)
        node = self.live[src_parent.entries[src_name]]
        dst_parent, dst_name = self.parent_of(new)
        existing = dst_parent.entries.get(dst_name)
        if existing == node.ino:
            return  # the same inode under both names: rename(2) does nothing
        if existing is not None:
            if flags & RENAME_NOREPLACE:
                raise FuseOSError(errno.EEXIST)
            self.check_replaceable(node, self.live[existing])
            self.remove_entry(dst_parent, dst_name)
        del src_parent.entries[src_name]
        dst_parent.entries[dst_name] = node.ino
        if node.is_dir:
            src_parent.nlink -= 1
            dst_parent.nlink += 1
        src_parent.mark_entries_changed()
        dst_parent.mark_entries_changed()
        node.ctime_ns = time.time_ns()

    @staticmethod
    def check_replaceable(node: Inode, target: Inode) -> None:
        if target.is_dir and not node.is_dir:
            raise FuseOSError(errno.EISDIR)
        if node.is_dir and not target.is_dir:
            raise FuseOSError(errno.ENOTDIR)
        if target.is_dir and target.names():
            raise FuseOSError(errno.ENOTEMPTY)

    # -- handles --------------------------------------------------------------------------------------
    def open_handle(self, node: Inode, flags: int = 0) -> int:
        if flags & os.O_TRUNC and node.is_file:
            self.truncate(node, 0)
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = Handle(node.ino, append=bool(flags & os.O_APPEND))
        node.open_count += 1
        return fh

    def close_handle(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        node = self.live.get(handle.ino) if handle else None
        if node is not None:
            node.open_count -= 1
            self.release_if_unused(node)

    def handle(self, fh: int) -> tuple[Handle, Inode]:
        handle = self.handles.get(fh)
        if handle is None or handle.ino not in self.live:
            raise FuseOSError(errno.EIO)  # opened before a cut
        return handle, self.live[handle.ino]

    def node_of(self, path: str | None, fh: int | None) -> Inode:
        if fh is not None:
            return self.handle(fh)[1]
        if path is None:
            raise FuseOSError(errno.EIO)
        return self.lookup(path)

    # -- content --------------------------------------------------------------------------------------
    @staticmethod
    def write(node: Inode, offset: int, data: bytes) -> None:
        size = len(node.data)
        node.mark_changed(min(offset, size))
        if offset > size:
            node.data.extend(bytes(offset - size))
        node.data[offset : offset + len(data)] = data

    @staticmethod
    def truncate(node: Inode, length: int) -> None:
        if not node.is_file:
            raise FuseOSError(errno.EISDIR if node.is_dir else errno.EINVAL)
        size = len(node.data)
        node.mark_changed(min(length, size))
        if length < size:
            del node.data[length:]
        else:
            node.data.extend(bytes(length - size))

    # -- durability -----------------------------------------------------------------------------------
    def sync(self, node: Inode) -> None:
        """fsync: a file's content, or a directory's entries (and the inodes they name: empty if never synced)."""
        durable = self.durable.get(node.ino)
        if durable is None:
            self.durable[node.ino] = node.snapshot(with_content=True)
        else:
            if node.unsynced_from is not None:  # only the changed tail: appends stay O(new bytes)
                with memoryview(node.data) as view:
                    durable.data[node.unsynced_from :] = view[node.unsynced_from :]
            durable.entries = node.names()
            node.copy_metadata_to(durable)
        for child in node.names().values():
            if child not in self.durable:
                self.durable[child] = self.live[child].snapshot(with_content=False)
        node.unsynced_from, node.entries_unsynced = None, False

    def persist(self, max_bytes: int | None) -> None:
        """Early writeback: every directory's entries, and every file of at most ``max_bytes`` (None: all)."""
        for node in list(self.live.values()):
            if node.is_dir or (node.is_file and (max_bytes is None or len(node.data) <= max_bytes)):
                self.sync(node)

    def cut(self) -> None:
        reachable: dict[int, Inode] = {}
        pending = [ROOT_INO]
        while pending:
            ino = pending.pop()
            if ino not in reachable:
                reachable[ino] = self.durable[ino]
                pending.extend(reachable[ino].entries.values())
        self.durable = reachable
        self.live = {ino: node.snapshot(with_content=True) for ino, node in reachable.items()}
        for node in self.live.values():
            node.unsynced_from, node.entries_unsynced = None, False
            node.nlink = 2 if node.is_dir else 0
        for node in self.live.values():
            for child in (self.live[ino] for ino in node.entries.values()):
                node.nlink += child.is_dir  # a subdirectory's ".." links back
                child.nlink += not child.is_dir
        self.handles.clear()  # what was open before the cut is gone (EIO)
        self.cuts += 1

    def stats(self) -> dict[str, int]:
        dirty_files = [n for n in self.live.values() if n.is_file and n.unsynced_from is not None]
        return {"volatile_files": len(dirty_files),
                "volatile_bytes": sum(max(len(n.data) - (n.unsynced_from or 0), 0) for n in dirty_files),
                "volatile_dirs": sum(1 for n in self.live.values() if n.is_dir and n.entries_unsynced),
                "live_inodes": len(self.live), "durable_inodes": len(self.durable),
                "open_handles": len(self.handles), "cuts": self.cuts}  # fmt: skip


def attributes(node: Inode) -> dict[str, Any]:
    size = len(node.data) if node.is_file else len(os.fsencode(node.target)) if stat.S_ISLNK(node.mode) else BLOCK
    return {"st_ino": node.ino, "st_mode": node.mode, "st_nlink": node.nlink, "st_uid": node.uid, "st_gid": node.gid,
            "st_size": size, "st_blocks": (size + 511) // 512, "st_blksize": BLOCK,
            "st_atime": node.atime_ns, "st_mtime": node.mtime_ns, "st_ctime": node.ctime_ns}  # fmt: skip


class LossyOperations(Operations):  # type: ignore[misc]
    """The FUSE callbacks: each takes the tree's lock and reads LIVE, changes it, or syncs to DURABLE.

    mfusepy turns a ``None`` result into 0 (success) and a raised ``FuseOSError`` into its errno.
    """

    use_ns = True

    def __init__(self, tree: Tree) -> None:
        self.tree = tree  # mfusepy takes any attribute named like a FUSE operation (e.g. "lock") for one

    def init_with_config(self, conn_info: Any, config: Any) -> None:
        config.use_ino = 1  # st_ino is the inode number
        # hard_remove stays off: an unlinked open file is renamed to HIDDEN_PREFIX... (so fstat still works)
        config.entry_timeout = config.attr_timeout = config.negative_timeout = 0.0  # a cut shows at once
        config.kernel_cache = config.auto_cache = config.direct_io = 0

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.tree.lock:
            return attributes(self.tree.node_of(path, fh))

    def access(self, path: str, amode: int) -> None:
        with self.tree.lock:
            self.tree.lookup(path)

    def statfs(self, path: str) -> dict[str, int]:
        blocks, inodes = FREE_BYTES // BLOCK, 1 << 20
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": blocks, "f_bfree": blocks, "f_bavail": blocks,
                "f_files": inodes, "f_ffree": inodes, "f_favail": inodes, "f_namemax": 255}  # fmt: skip

    # -- names ----------------------------------------------------------------------------------------
    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self.tree.lock:
            parent, name = self.tree.parent_of(path)
            if name not in parent.entries:
                node = self.tree.add_new(parent, name, stat.S_IFREG | (mode & 0o7777))
            elif flags & os.O_EXCL:
                raise FuseOSError(errno.EEXIST)
            else:
                node = self.tree.live[parent.entries[name]]
            return self.tree.open_handle(node, flags)

    def mkdir(self, path: str, mode: int) -> None:
        with self.tree.lock:
            self.tree.add_new(*self.tree.parent_of(path), stat.S_IFDIR | (mode & 0o7777))

    def symlink(self, target: str, source: str) -> None:
        with self.tree.lock:
            self.tree.add_new(*self.tree.parent_of(target), stat.S_IFLNK | 0o777).target = source

    def link(self, target: str, source: str) -> None:
        with self.tree.lock:
            node = self.tree.lookup(source)
            if node.is_dir:
                raise FuseOSError(errno.EPERM)
            self.tree.add_entry(*self.tree.parent_of(target), node)

    def readlink(self, path: str) -> str:
        with self.tree.lock:
            node = self.tree.lookup(path)
            if not stat.S_ISLNK(node.mode):
                raise FuseOSError(errno.EINVAL)
            return node.target

    def unlink(self, path: str) -> None:
        with self.tree.lock:
            self.tree.remove(path, directory=False)

    def rmdir(self, path: str) -> None:
        with self.tree.lock:
            self.tree.remove(path, directory=True)

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        with self.tree.lock:
            self.tree.rename(old, new, flags)

    # -- metadata -------------------------------------------------------------------------------------
    def chmod(self, path: str | None, mode: int) -> None:
        with self.tree.lock:
            node = self.tree.node_of(path, None)
            node.mode = stat.S_IFMT(node.mode) | (mode & 0o7777)
            node.ctime_ns = time.time_ns()

    def chown(self, path: str | None, uid: int, gid: int) -> None:
        with self.tree.lock:
            node = self.tree.node_of(path, None)
            node.uid, node.gid = node.uid if uid == -1 else uid, node.gid if gid == -1 else gid
            node.ctime_ns = time.time_ns()

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> None:
        now = time.time_ns()
        atime, mtime = times or (now, now)
        with self.tree.lock:
            node = self.tree.node_of(path, None)
            node.atime_ns = {UTIME_NOW: now, UTIME_OMIT: node.atime_ns}.get(atime, atime)
            node.mtime_ns = {UTIME_NOW: now, UTIME_OMIT: node.mtime_ns}.get(mtime, mtime)
            node.ctime_ns = now

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        with self.tree.lock:
            self.tree.truncate(self.tree.node_of(path, fh), length)

    # -- open files and directories -------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        with self.tree.lock:
            return self.tree.open_handle(self.tree.lookup(path), flags)

    def opendir(self, path: str) -> int:
        with self.tree.lock:
            node = self.tree.lookup(path)
            if not node.is_dir:
                raise FuseOSError(errno.ENOTDIR)
            return self.tree.open_handle(node)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.tree.lock, memoryview(self.tree.handle(fh)[1].data) as view:
            return bytes(view[offset : offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.tree.lock:
            handle, node = self.tree.handle(fh)
            self.tree.write(node, len(node.data) if handle.append else offset, data)
        return len(data)

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        with self.tree.lock:
            node = self.tree.handle(fh)[1]
            listing = [(".", node), ("..", node), *((name, self.tree.live[ino]) for name, ino in node.names().items())]
            return [(name, {"st_ino": child.ino, "st_mode": child.mode}, 0) for name, child in listing]

    def flush(self, path: str | None, fh: int) -> None:
        """close(2): not a sync."""

    def fsync(self, path: str | None, datasync: int, fh: int) -> None:
        with self.tree.lock:
            self.tree.sync(self.tree.handle(fh)[1])

    def release(self, path: str | None, fh: int) -> None:
        with self.tree.lock:
            self.tree.close_handle(fh)

    fsyncdir = fsync
    releasedir = release


class LossyFUSE(FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, passing on what it drops: rename's flags (RENAME_NOREPLACE), ftruncate's handle."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        decode = self.encoding, self.errors
        return self.operations.rename(old.decode(*decode), new.decode(*decode), flags) or 0

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None  # a handle from before a cut must not truncate today's file
        return self.operations.truncate(path and path.decode(self.encoding, self.errors), length, fh) or 0


# -- control ------------------------------------------------------------------------------------------
def answer(tree: Tree, request: str) -> dict[str, Any]:
    command, _, argument = request.strip().partition(" ")
    with tree.lock:
        if command == "cut":
            tree.cut()
        elif command == "persist":
            tree.persist(int(argument))
        elif command == "persist_all":
            tree.persist(None)
        elif command not in ("stats", "ping"):
            return {"ok": False, "error": f"unknown request {request.strip()!r}"}
        return {"ok": True, **tree.stats()}


def serve_control(tree: Tree, server: socket.socket) -> None:
    """Answer each line of each connection, one connection at a time, until the socket is closed."""
    while True:
        connection, _ = server.accept()
        with contextlib.suppress(OSError), connection, connection.makefile("rwb") as stream:
            for line in stream:
                try:
                    reply = answer(tree, line.decode())
                except Exception as error:  # a bad request must not end the server
                    reply = {"ok": False, "error": repr(error)}
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--control", required=True, help="Unix socket path for cut/persist/stats requests")
    args = parser.parse_args()
    if fuse_version_major != 3:  # the timeouts, use_ino and hard_remove are set in libfuse3's config
        raise SystemExit(f"lossy_fs.py needs libfuse3, mfusepy loaded libfuse{fuse_version_major}: make powerloss-deps")
    tree = Tree()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.control)
    server.listen(8)
    threading.Thread(target=serve_control, args=(tree, server), daemon=True, name="control").start()
    try:
        LossyFUSE(LossyOperations(tree), args.mountpoint, foreground=True, allow_other=True, fsname="lossyfs")
    except RuntimeError as error:
        if error.args != (8,):  # libfuse3's fuse_main returns 8 when a signal (SIGTERM) ended its loop
            raise
    finally:
        server.close()
        os.unlink(args.control)


if __name__ == "__main__":
    main()
