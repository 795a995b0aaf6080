"""Self-tests of the power-loss filesystem: each would fail if a rule of its model were wrong."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from .helpers import LossyMount


def write_file(path: Path, data: bytes, sync: bool = True, flags: int = os.O_CREAT | os.O_TRUNC) -> None:
    fd = os.open(path, os.O_WRONLY | flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_write_is_gone_after_cut(lossy: LossyMount) -> None:
    path = lossy.path / "f"
    write_file(path, b"durable")
    sync_dir(lossy.path)
    write_file(path, b"volatile!", sync=False)
    assert path.read_bytes() == b"volatile!"  # in the kernel's page and attribute caches now
    assert lossy.stats()["volatile_files"] == 1
    lossy.cut()
    assert path.read_bytes() == b"durable"
    assert lossy.stats()["volatile_files"] == 0


def test_synced_file_in_synced_dir_keeps_its_content(lossy: LossyMount) -> None:
    (lossy.path / "d").mkdir()
    write_file(lossy.path / "d" / "f", b"kept")
    sync_dir(lossy.path / "d")
    sync_dir(lossy.path)
    lossy.cut()
    assert (lossy.path / "d" / "f").read_bytes() == b"kept"


def test_new_file_synced_in_unsynced_dir_is_gone(lossy: LossyMount) -> None:
    write_file(lossy.path / "f", b"data")
    assert (lossy.path / "f").stat().st_size == 4  # the kernel's dentry and attributes are cached now
    lossy.cut()
    assert not (lossy.path / "f").exists()
    assert os.listdir(lossy.path) == []


def test_durable_name_without_synced_data_reads_empty(lossy: LossyMount) -> None:
    (lossy.path / "d").mkdir()
    write_file(lossy.path / "f", b"never synced", sync=False)
    write_file(lossy.path / "d" / "g", b"synced, name not")
    sync_dir(lossy.path)
    lossy.cut()
    assert (lossy.path / "f").read_bytes() == b""
    assert os.listdir(lossy.path / "d") == []


def test_replace_needs_a_dir_sync(lossy: LossyMount) -> None:
    target, temp = lossy.path / "target", lossy.path / "target.tmp"
    write_file(target, b"old")
    sync_dir(lossy.path)
    write_file(temp, b"new")
    sync_dir(lossy.path)
    os.replace(temp, target)
    lossy.cut()
    assert target.read_bytes() == b"old"
    assert temp.read_bytes() == b"new"

    os.replace(temp, target)
    sync_dir(lossy.path)
    lossy.cut()
    assert target.read_bytes() == b"new"
    assert not temp.exists()


def test_append_keeps_exactly_the_synced_prefix(lossy: LossyMount) -> None:
    path = lossy.path / "journal"
    write_file(path, b"", sync=False)
    sync_dir(lossy.path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"one\n")
    os.write(fd, b"two\n")
    os.fsync(fd)
    os.write(fd, b"three\n")
    os.close(fd)
    write_file(path, b"four\n", sync=False, flags=os.O_APPEND)
    assert path.read_bytes() == b"one\ntwo\nthree\nfour\n"
    lossy.cut()
    assert path.read_bytes() == b"one\ntwo\n"


def test_persist_writes_back_small_files_and_all_names(lossy: LossyMount) -> None:
    (lossy.path / "d").mkdir()
    write_file(lossy.path / "d" / "small", b"s" * 4096, sync=False)
    write_file(lossy.path / "big", b"b" * 4097, sync=False)
    lossy.persist(4096)
    assert lossy.stats()["volatile_files"] == 1
    lossy.cut()
    assert (lossy.path / "d" / "small").read_bytes() == b"s" * 4096
    assert (lossy.path / "big").read_bytes() == b""
    write_file(lossy.path / "big", b"b" * 4097, sync=False)
    stats = lossy.persist_all()
    assert (stats["volatile_files"], stats["volatile_dirs"], stats["volatile_bytes"]) == (0, 0, 0)


def test_stale_handle_fails_after_cut(lossy: LossyMount) -> None:
    path = lossy.path / "f"
    write_file(path, b"durable")
    sync_dir(lossy.path)
    fd = os.open(path, os.O_RDWR)
    try:
        lossy.cut()
        for call in (lambda: os.write(fd, b"x"), lambda: os.ftruncate(fd, 0)):
            with pytest.raises(OSError) as raised:
                call()
            assert raised.value.errno in (errno.EIO, errno.ESTALE)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"durable"


def test_file_unlinked_while_open_stays_usable_unlisted_and_not_durable(lossy: LossyMount) -> None:
    fd = os.open(lossy.path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.unlink(lossy.path / "f")
        os.write(fd, b"x")
        os.fsync(fd)
        assert os.fstat(fd).st_size == 1
        assert os.listdir(lossy.path) == []
        sync_dir(lossy.path)
        lossy.cut()
    finally:
        os.close(fd)
    assert os.listdir(lossy.path) == []


def test_hard_links_share_the_inode(lossy: LossyMount) -> None:
    first, second = lossy.path / "a", lossy.path / "b"
    write_file(first, b"shared")
    os.link(first, second)
    write_file(second, b"changed", flags=0)
    assert first.read_bytes() == b"changed"
    assert first.stat().st_ino == second.stat().st_ino
    assert first.stat().st_nlink == 2
    second.unlink()
    assert first.stat().st_nlink == 1


def test_rmdir_of_a_non_empty_dir_fails(lossy: LossyMount) -> None:
    (lossy.path / "d").mkdir()
    write_file(lossy.path / "d" / "f", b"")
    with pytest.raises(OSError) as raised:
        (lossy.path / "d").rmdir()
    assert raised.value.errno == errno.ENOTEMPTY


def test_locks_are_the_kernels(lossy: LossyMount) -> None:
    write_file(lossy.path / "lock", b"")
    with open(lossy.path / "lock", "rb") as holder, open(lossy.path / "lock", "rb") as other:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # POSIX locks: the kernel's too, no EINVAL from the daemon


def test_statvfs_shows_free_space(lossy: LossyMount) -> None:
    stats = os.statvfs(lossy.path)
    assert stats.f_bavail * stats.f_frsize >= 50 << 30


def test_mmap_read_sees_the_content(lossy: LossyMount) -> None:
    data = os.urandom(3 * mmap.PAGESIZE + 5)
    write_file(lossy.path / "f", data, sync=False)
    with open(lossy.path / "f", "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data


def test_torch_save_and_load(lossy: LossyMount) -> None:
    tensors = {"x": torch.arange(1000, dtype=torch.float32), "y": torch.ones(3, 4)}
    torch.save(tensors, lossy.path / "t.pt")
    loaded = torch.load(lossy.path / "t.pt")
    assert all(torch.equal(tensors[key], loaded[key]) for key in tensors)


def test_parquet_round_trip(lossy: LossyMount) -> None:
    table = pa.table({"ids": list(range(10_000)), "text": [str(i) for i in range(10_000)]})
    pq.write_table(table, lossy.path / "t.parquet")
    assert pq.read_table(lossy.path / "t.parquet", memory_map=True).equals(table)
