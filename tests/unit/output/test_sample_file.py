"""Sample files written with direct I/O and buffered: the same bytes and checksum for any sizes of writes, a write the
kernel refuses redone buffered, and which filesystems ``--output-io auto`` writes directly (real files; the
direct path needs the test's folder on a local disk filesystem, as /tmp is on these machines)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from hsextract.durable.mounts import mount_of
from hsextract.output import sample_file
from hsextract.output.checksum import file_checksum
from hsextract.output.sample_file import DIRECT_FILESYSTEMS, STAGE_BYTES, SampleFile, choose_direct

#: sizes of consecutive writes: empty, tiny, header-like, around the alignment and the staging buffer, large
WRITE_PLANS = {
    "nothing": [],
    "one_byte": [1],
    "headers_and_records": [30, 64, 4096 - 94, 70_000, 17, 3 * STAGE_BYTES // 2 + 5, 933],
    "aligned": [4096, STAGE_BYTES, 8192],
    "many_small": [random.Random(7).randrange(1, 3000) for _ in range(400)],
}


def _direct_here(path: Path) -> None:
    mount = mount_of(path)
    if mount is None or mount.fstype not in DIRECT_FILESYSTEMS:
        pytest.skip(f"{path} is on {mount.fstype if mount else 'an unknown filesystem'}: no direct I/O to test here")


def _write(path: Path, sizes: list[int], direct: bool) -> tuple[bytes, SampleFile, str]:
    generator = random.Random(sum(sizes))
    chunks = [generator.randbytes(size) for size in sizes]
    with SampleFile(path, direct) as out:
        for chunk in chunks:
            assert out.write(memoryview(chunk)) == len(chunk)
        written = out.finish()
    assert written.bytes == sum(sizes)
    return b"".join(chunks), out, written.checksum


@pytest.mark.parametrize("plan", list(WRITE_PLANS))
def test_direct_and_buffered_files_hold_the_same_bytes_and_checksum(tmp_path: Path, plan: str) -> None:
    _direct_here(tmp_path)
    data, direct, direct_sum = _write(tmp_path / "direct", WRITE_PLANS[plan], direct=True)
    assert direct.direct, "written directly all through"
    _, buffered, buffered_sum = _write(tmp_path / "buffered", WRITE_PLANS[plan], direct=False)
    assert not buffered.direct
    for name in ("direct", "buffered"):
        assert (tmp_path / name).read_bytes() == data, name
        assert file_checksum(tmp_path / name) == direct_sum
    assert buffered_sum == direct_sum


@pytest.mark.parametrize(
    ("patch", "sizes"),
    [
        # the last block padded to 100 bytes: the file's last write is refused
        ({"ALIGN": 100}, [STAGE_BYTES, 5000]),
        # a staging buffer of 1 MiB + 100 bytes: its first write, in the middle of a large one, is refused; the rest
        # of that write and the next ones follow it in order
        ({"STAGE_BYTES": (1 << 20) + 100}, [3 << 20, 5000, 70_000, 3]),
    ],
    ids=["at_the_end", "mid_write"],
)
def test_a_write_the_kernel_refuses_is_written_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patch: dict[str, int], sizes: list[int]
) -> None:
    """A length that is no multiple of any disk's block is refused by the kernel (EINVAL): the file goes on buffered
    from there, with the same bytes (as on a filesystem that takes O_DIRECT at open but not the write)."""
    _direct_here(tmp_path)
    for name, value in patch.items():
        monkeypatch.setattr(sample_file, name, value)
    monkeypatch.setattr(sample_file, "_stages", sample_file._Stages())  # buffers of the patched size
    data, out, checksum = _write(tmp_path / "refused", sizes, direct=True)
    assert not out.direct, "the refused write switched the file to buffered"
    assert (tmp_path / "refused").read_bytes() == data
    assert file_checksum(tmp_path / "refused") == checksum


def test_an_unfinished_file_is_closed_and_gives_its_buffer_back(tmp_path: Path) -> None:
    _direct_here(tmp_path)
    with pytest.raises(RuntimeError), SampleFile(tmp_path / "torn", direct=True) as out:
        out.write(b"x" * 10_000)
        stage = out._stage
        raise RuntimeError("the format failed mid-file")
    assert out._fd == -1 and out._stage is None
    assert stage is not None and stage in sample_file._stages._free
    data, _, _ = _write(tmp_path / "next", [10_000], direct=True)  # takes it again
    assert (tmp_path / "next").read_bytes() == data


def test_torch_save_through_it_loads_the_same(tmp_path: Path) -> None:
    record = {"ids": torch.arange(1000), "states": torch.randn(300, 4, 256).to(torch.bfloat16)}
    for direct in (True, False):
        path = tmp_path / f"direct-{direct}.ckpt"
        with SampleFile(path, direct) as out:
            torch.save(record, out)  # type: ignore[arg-type]
            written = out.finish()
        assert written.bytes == path.stat().st_size and written.checksum == file_checksum(path)
        loaded = torch.load(path, weights_only=True)
        assert torch.equal(loaded["ids"], record["ids"]) and torch.equal(loaded["states"], record["states"])
    assert (tmp_path / "direct-True.ckpt").read_bytes() == (tmp_path / "direct-False.ckpt").read_bytes()


def test_auto_writes_directly_on_a_local_disk_filesystem_only(tmp_path: Path) -> None:
    mount = mount_of(tmp_path)
    assert mount is not None
    direct, why = choose_direct("auto", tmp_path / "not-made-yet" / "output")
    assert direct == (mount.fstype in DIRECT_FILESYSTEMS), why
    assert mount.fstype in why
    shm = Path("/dev/shm")
    if os.path.isdir(shm) and (shm_mount := mount_of(shm)) is not None and shm_mount.fstype == "tmpfs":
        assert choose_direct("auto", shm) == (False, f"{shm} is on tmpfs, not a local disk filesystem "
                                               f"({', '.join(sorted(DIRECT_FILESYSTEMS))})")  # fmt: skip
    assert choose_direct("direct", shm)[0] is True
    assert choose_direct("buffered", tmp_path)[0] is False
