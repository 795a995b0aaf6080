"""A sample file written under its temp name, checksummed and counted as it goes, with direct I/O where the output's
filesystem takes it.

Buffered, every byte of a sample is copied into the page cache, written back later by the kernel's flusher threads,
and pushes out what else the host keeps cached; the row's sync then waits for that write-back. With direct I/O
(``O_DIRECT``) the bytes go from one aligned staging buffer per file being written to the disk: on this machine's
ext4, a 28 MB SpecForge sample written and synced took 5.1-6.1 ms of CPU direct, 8.9-37 ms buffered, and less
wall time (bench/results-output-io.json).
A direct write returns once the disk has the bytes, so a packing turn now holds the disk's latency (buffered, the
row's thread waits for it in its fsync, outside any turn): ``--output-io`` is ``buffered`` by default, faster end to end
on one H100's host, whose disk took direct writes more slowly even alone (bench/results-gpu-e2e-pages-io.json).
``auto`` writes directly on the local disk filesystems of :data:`DIRECT_FILESYSTEMS` and buffered elsewhere: tmpfs
(direct I/O is a copy there too), network and FUSE filesystems (where it may be slower or refused). A filesystem
that refuses it at the first write is written buffered from there on, the same bytes.

The file's bytes are the same either way: the last block is written padded to the alignment, then the file is cut
to its size.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Literal

import xxhash

from hsextract.durable.mounts import mount_of
from hsextract.output.checksum import ALGORITHM, WrittenFile

log = logging.getLogger(__name__)

OutputIO = Literal["auto", "direct", "buffered"]
#: local disk filesystems that take O_DIRECT (auto writes directly there)
DIRECT_FILESYSTEMS = frozenset({"ext4", "ext3", "ext2", "xfs", "btrfs", "f2fs"})
#: file offsets, lengths and the buffer's address of a direct write: a multiple of every common logical block size
ALIGN = 4096
#: the staging buffer of a file being written directly (a multiple of ALIGN): what one direct write carries
STAGE_BYTES = 8 << 20
#: bytes checksummed and copied at a time: the piece is still in the core's cache when it is copied
PIECE_BYTES = 512 << 10
#: buffered: writes under this size are gathered into one (a zip record's header is tens of bytes)
SMALL_WRITE_BYTES = 64 << 10

_told_refused = False


def choose_direct(output_io: OutputIO, output: Path) -> tuple[bool, str]:
    """Whether sample files under ``output`` are written with direct I/O, and why (for the log)."""
    if output_io != "auto":
        return output_io == "direct", f"--output-io {output_io}"
    existing = next((path for path in (output, *output.parents) if path.exists()), output)  # a new output's parent
    mount = mount_of(existing)
    fstype = mount.fstype if mount is not None else "unknown"
    if fstype in DIRECT_FILESYSTEMS:
        return True, f"{output} is on {fstype}"
    return False, f"{output} is on {fstype}, not a local disk filesystem ({', '.join(sorted(DIRECT_FILESYSTEMS))})"


class _Stages:
    """Staging buffers, page-aligned (anonymous maps): one taken by each file being written directly, given back
    when it closes, so a process holds as many as it writes files at once (its packing turns), not one a thread."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, STAGE_BYTES)

    def give(self, stage: mmap.mmap) -> None:
        with self._lock:
            self._free.append(stage)


_stages = _Stages()


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


class SampleFile:
    """Open ``path`` (created or truncated) for one sample; :meth:`write` takes what the format writes (an object
    with ``write``, as ``torch.save`` wants), :meth:`finish` returns its size and checksum and closes it. Used as a
    context manager, a file not finished is closed (its caller removes the temp file).

    ``size``, when the format knows it: a buffered file is sized before its first write. On a tmpfs mounted
    ``huge=within_size`` only what lies within a file's size gets huge pages, and kernels that look at the size alone
    give a file that grows write by write small ones (``contract/files/dump_pages.py``): an output on tmpfs then
    faults in and clears every 4 KiB of a 28 MB sample on its own."""

    def __init__(self, path: Path, direct: bool, size: int | None = None) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self._direct = direct
        if direct:
            try:
                self._fd = os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct = False  # the filesystem refuses it at open
                _tell_refused(path)
        if not self._direct:
            self._fd = os.open(path, flags, 0o644)
            if size:
                try:
                    os.ftruncate(self._fd, size)
                except BaseException:
                    os.close(self._fd)
                    raise
        self._sized_to = size if size and not self._direct else None
        self._path = path
        self._hash = xxhash.xxh3_128()
        self._bytes = 0
        self._stage: mmap.mmap | None = None  # taken at the first direct write
        self._staged = 0  # bytes in the staging buffer, not yet written
        self._pending = bytearray()  # buffered: small writes not yet written

    @property
    def direct(self) -> bool:
        """Whether the file is being written with direct I/O (False after a refusal)."""
        return self._direct

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        self._bytes += size
        if self._direct:
            view = self._stage_direct(view)
        if view:  # buffered, or what is left after the filesystem refused a direct write
            self._write_buffered(view)
        return size

    def _stage_direct(self, view: memoryview) -> memoryview:
        """Checksum and stage ``view`` a piece at a time, writing the buffer each time it fills; returns what is left
        when a refused write turned the file buffered meanwhile (nothing is left staged then)."""
        if self._stage is None:
            self._stage = _stages.take()
        stage = self._stage
        while view and self._direct:
            piece = view[: min(PIECE_BYTES, STAGE_BYTES - self._staged)]
            self._hash.update(piece)
            stage[self._staged : self._staged + piece.nbytes] = piece
            self._staged += piece.nbytes
            view = view[piece.nbytes :]
            if self._staged == STAGE_BYTES:
                self._write_staged(STAGE_BYTES)
        return view

    def _write_buffered(self, view: memoryview) -> None:
        self._hash.update(view)
        if view.nbytes < SMALL_WRITE_BYTES:  # torch.save's record headers: gathered, as a buffered file object would
            self._pending += view
            if len(self._pending) >= SMALL_WRITE_BYTES:
                self._write_pending()
        else:
            self._write_pending()
            _write_all(self._fd, view)

    def flush(self) -> None:
        """Nothing to do: staged bytes are written by :meth:`finish` (``torch.save`` may call it)."""

    def _write_pending(self) -> None:
        if self._pending:
            _write_all(self._fd, memoryview(self._pending))
            self._pending.clear()

    def _write_staged(self, length: int) -> None:
        """Write the first ``length`` staged bytes (a multiple of ALIGN) at the file's aligned position."""
        assert self._stage is not None  # bytes were staged
        view = memoryview(self._stage)[:length]
        try:
            _write_all(self._fd, view)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # refused at the first write (some filesystems accept the flag at open): the same bytes, buffered
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self._direct = False
            _tell_refused(self._path)
            _write_all(self._fd, view)
        finally:
            view.release()
        self._staged = 0

    def finish(self) -> WrittenFile:
        """Write what is staged (the last block padded to ALIGN, then the file cut to its size) and close."""
        try:
            self._write_pending()
            if self._staged:
                staged = self._staged
                padded = -(-staged // ALIGN) * ALIGN
                assert self._stage is not None
                self._stage[staged:padded] = bytes(padded - staged)
                self._write_staged(padded)
                if padded != staged:
                    os.ftruncate(self._fd, self._bytes)
            elif self._sized_to is not None and self._sized_to != self._bytes:  # sized for other than was written
                os.ftruncate(self._fd, self._bytes)
        finally:
            self.close()
        return WrittenFile(self._bytes, f"{ALGORITHM}:{self._hash.hexdigest()}")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._stage is not None:
            _stages.give(self._stage)
            self._stage = None

    def __enter__(self) -> SampleFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._staged = 0
        self.close()


def _tell_refused(path: Path) -> None:
    global _told_refused
    if not _told_refused:
        _told_refused = True
        log.warning("the filesystem of %s refuses direct I/O: sample files are written buffered (--output-io buffered)", path)
