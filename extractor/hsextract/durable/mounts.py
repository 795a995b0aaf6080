"""The mount that holds a path, from the kernel's mount table: what the dump root's tmpfs gives
(``contract/files/dump_pages.py``) and whether the output's filesystem takes direct I/O (``output/sample_file.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str  # "tmpfs", "ext4", "fuse.lossy", ...
    options: dict[str, str]  # the filesystem's own (super block) options; a flag without a value maps to ""


def _unescape(field: str) -> str:
    """A mountinfo field as a path: the kernel writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_of(path: Path, mountinfo: Path = MOUNTINFO) -> Mount | None:
    """The mount that holds ``path`` (matched by its device: a bind mount reads as the filesystem it shows); None
    when ``path`` or the table cannot be read."""
    try:
        st_dev = os.stat(path).st_dev
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[2] != wanted or "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        options = dict(option.partition("=")[::2] for option in fields[dash + 3].split(","))
        return Mount(_unescape(fields[4]), fields[dash + 1], options)
    return None
