"""Reading which tmpfs holds the dump root and whether it gives huge pages, from mountinfo and the kernel's switch
as the kernel writes them (real files laid out as /proc and /sys show them; tests/test_dump_pages.py mounts real ones)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hsextract.contract.files.dump_pages import huge_pages_advice, kernel_override, tmpfs_mount

SWITCH_NEVER = "always within_size advise [never] deny force\n"


def _mountinfo(tmp_path: Path, fstype: str, super_options: str, point: str = "/dev/shm", name: str = "mountinfo") -> Path:
    """A mountinfo with an unrelated mount, then the one that holds ``tmp_path`` (its device numbers)."""
    dev = os.stat(tmp_path).st_dev
    lines = [
        "22 1 0:21 / /proc rw,nosuid - proc proc rw",
        f"31 22 {os.major(dev)}:{os.minor(dev)} / {point} rw,nosuid,nodev shared:5 - {fstype} tmpfs {super_options}",
    ]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _switch(tmp_path: Path, text: str = SWITCH_NEVER) -> Path:
    path = tmp_path / "shmem_enabled"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("super_options", "huge"),
    [("rw,size=1048576k,huge=within_size", "within_size"), ("rw,size=1048576k,inode64", "never"), ("rw,huge=always", "always")],
)
def test_the_tmpfs_that_holds_a_path_and_its_huge_option(tmp_path: Path, super_options: str, huge: str) -> None:
    assert tmpfs_mount(tmp_path, _mountinfo(tmp_path, "tmpfs", super_options, r"/mnt/dump\040root")) == ("/mnt/dump root", huge)


def test_a_path_on_another_filesystem_is_not_on_tmpfs(tmp_path: Path) -> None:
    mountinfo = _mountinfo(tmp_path, "ext4", "rw,errors=remount-ro")
    assert tmpfs_mount(tmp_path, mountinfo) is None
    assert huge_pages_advice(tmp_path, mountinfo, _switch(tmp_path)) is None


def test_a_missing_path_or_mountinfo_tells_nothing(tmp_path: Path) -> None:
    assert tmpfs_mount(tmp_path / "absent", _mountinfo(tmp_path, "tmpfs", "rw")) is None
    assert tmpfs_mount(tmp_path, tmp_path / "no-mountinfo") is None


@pytest.mark.parametrize(
    ("text", "override"),
    [(SWITCH_NEVER, None), ("always within_size advise never [deny] force\n", "deny"), ("[force]\n", "force"), ("", None)],
)
def test_the_kernels_switch_overrides_only_when_deny_or_force(tmp_path: Path, text: str, override: str | None) -> None:
    assert kernel_override(_switch(tmp_path, text)) == override


def test_a_small_page_tmpfs_gets_one_line_naming_the_remount(tmp_path: Path) -> None:
    advice = huge_pages_advice(tmp_path, _mountinfo(tmp_path, "tmpfs", "rw,size=64g"), _switch(tmp_path))
    assert advice is not None
    assert "huge=never" in advice
    assert "mount -o remount,huge=within_size /dev/shm" in advice


@pytest.mark.parametrize("super_options", ["rw,huge=within_size", "rw,huge=always"])
def test_a_huge_page_tmpfs_gets_no_line(tmp_path: Path, super_options: str) -> None:
    assert huge_pages_advice(tmp_path, _mountinfo(tmp_path, "tmpfs", super_options), _switch(tmp_path)) is None


def test_the_kernels_switch_decides_over_the_mount(tmp_path: Path) -> None:
    huge = _mountinfo(tmp_path, "tmpfs", "rw,huge=within_size", name="huge")
    small = _mountinfo(tmp_path, "tmpfs", "rw", name="small")
    assert huge_pages_advice(tmp_path, small, _switch(tmp_path, "always within_size advise never deny [force]\n")) is None
    denied = huge_pages_advice(tmp_path, huge, _switch(tmp_path, "always within_size advise never [deny] force\n"))
    assert denied is not None and "deny" in denied


def test_a_kernel_without_huge_pages_for_tmpfs_gets_no_line(tmp_path: Path) -> None:
    assert huge_pages_advice(tmp_path, _mountinfo(tmp_path, "tmpfs", "rw"), tmp_path / "no-switch") is None
