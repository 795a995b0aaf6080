"""Dumps on huge pages, on real tmpfs mounts (root): a tmpfs mounted huge=within_size backs each dump's whole 2 MiB
stretches with huge pages, and both sides say how to mount one when the dump root's tmpfs has small pages."""

from __future__ import annotations

import logging
import mmap
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from hsextract.capture.dump_sink import DumpSink
from hsextract.contract.files.dump_pages import SHMEM_ENABLED, huge_pages_advice, kernel_override, tmpfs_mount
from hsextract.contract.files.dumps import HIDDEN_FILE, DumpSource, read_dump, write_dump
from hsextract.contract.rids import make_rid

from .helpers import tmpfs_mounts

pytestmark = pytest.mark.root

SOURCE = DumpSource("test", "0", "model", layer_ids=[0, 1, 2], capture_indices=[1, 2, 3])
HUGE_PAGE = 2 << 20


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a real tmpfs with the given huge= option; skipped where mounting or huge pages are impossible."""
    if not SHMEM_ENABLED.exists() or kernel_override() is not None:
        pytest.skip(f"this kernel gives tmpfs no huge pages, or decides for every mount ({SHMEM_ENABLED})")
    with tmpfs_mounts(tmp_path) as mount:
        yield lambda huge: mount(huge, 256 << 20, f"huge={huge}")


def _dump(root: Path, tokens: int = 300, hidden: int = 4096) -> Path:
    """A bf16 dump of ``tokens`` x 3 aux + final states (about 9.8 MB at the defaults)."""
    states = torch.randn(tokens, 4, hidden).to(torch.bfloat16)
    return write_dump(
        root, make_rid(1, tokens), torch.arange(tokens), states[:, :3].contiguous(), states[:, 3].contiguous(), SOURCE
    )


def huge_page_bytes(path: Path) -> int:
    """Bytes of ``path`` a shared mapping of it maps with huge pages (``ShmemPmdMapped`` of its smaps entry)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        for offset in range(0, len(mapped), mmap.PAGESIZE):  # fault every page in
            mapped[offset]
        smaps = Path("/proc/self/smaps").read_text()
        entry = smaps[smaps.index(str(path)) :]
        return int(re.search(r"ShmemPmdMapped:\s+(\d+) kB", entry).group(1)) * 1024  # type: ignore[union-attr]


def free_huge_blocks() -> int:
    """Free 2 MiB blocks the kernel could hand out now (orders 9 and up of /proc/buddyinfo): a tmpfs huge page is
    taken only from those, without compaction, else the file gets small pages."""
    total = 0
    for line in Path("/proc/buddyinfo").read_text().splitlines():
        counts = [int(count) for count in line.split()[4:]]
        total += sum(count << (order - 9) for order, count in enumerate(counts) if order >= 9)
    return total


def test_a_dump_on_a_within_size_tmpfs_lies_in_huge_pages(tmpfs: Callable[[str], Path]) -> None:
    if free_huge_blocks() < 64:
        pytest.skip(f"the machine's free memory is in pieces now ({free_huge_blocks()} free 2 MiB blocks)")
    for huge, whole_stretches in (("within_size", True), ("never", False)):
        hidden = _dump(tmpfs(huge)) / HIDDEN_FILE
        size = hidden.stat().st_size
        expected = size // HUGE_PAGE * HUGE_PAGE if whole_stretches else 0
        assert huge_page_bytes(hidden) == expected, f"huge={huge}: {size} bytes"
        assert read_dump(hidden.parent).aux_hidden_states is not None  # read back as any dump


def test_the_dump_roots_mount_is_read_from_the_kernel(tmpfs: Callable[[str], Path]) -> None:
    huge, small = tmpfs("within_size"), tmpfs("never")
    assert tmpfs_mount(huge / ".") == (str(huge), "within_size")
    assert huge_pages_advice(huge) is None
    advice = huge_pages_advice(small)
    assert advice is not None and f"mount -o remount,huge=within_size {small}" in advice


def test_the_dump_writer_says_once_how_to_mount_its_root(tmpfs: Callable[[str], Path], caplog: pytest.LogCaptureFixture) -> None:
    small, huge = tmpfs("never"), tmpfs("within_size")
    with caplog.at_level(logging.INFO, logger="hsextract.capture.dump_sink"):
        DumpSink(huge / "dumps", SOURCE).close()
        assert "huge" not in caplog.text
        DumpSink(small / "dumps", SOURCE).close()
    assert f"mount -o remount,huge=within_size {small}" in caplog.text
