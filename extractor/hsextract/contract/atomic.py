"""Writes that are never visible half-done: a temp name beside the target, then ``os.replace``.

Every temp file the package writes is named by :func:`temp_path`, so a run killed mid-write leaves
only names :func:`is_temp_name` recognises, which the next run sweeps and ``verify`` reports.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

_TEMP_NAME_RE = re.compile(r"^\..+\.tmp-\d+(-\d+)?$")


def temp_path(path: Path) -> Path:
    """A hidden sibling of ``path``, unique per process and thread."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def is_temp_name(name: str) -> bool:
    return _TEMP_NAME_RE.match(name) is not None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = temp_path(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
