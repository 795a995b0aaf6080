"""Checksums of the sample files: taken while a file is written, checked on resume and by verify.

``xxh3-128:<32 hex>`` of the file's bytes: they detect damage (a truncated, zeroed or altered file),
not tampering, and xxh3 does that at ~50 GB/s, where sha256 (2 GB/s) halved the pack stage's rate
and CRC32 (7 GB/s) still cost a fifth of it. Both writers checksum what they hand to
the file as it goes (``output/sample_file.py``, no second pass); :func:`file_checksum` reads a written
file back (resume, verify, merge).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import xxhash

ALGORITHM = "xxh3-128"
_CHUNK = 4 << 20


@dataclass(frozen=True)
class WrittenFile:
    """What a format wrote for one sample: its size and checksum, recorded in samples.jsonl."""

    bytes: int
    checksum: str


def file_checksum(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return f"{ALGORITHM}:{digest.hexdigest()}"


#: what the size-only check reads of each end of a file: a file a power loss kept the size of but not the
#: data of reads as zeros there (every format's file starts with its header and ends with its own data)
END_BYTES = 4096


def _zeroed_end(path: Path, size: int) -> str | None:
    """What ``--resume-check size`` can tell cheaply beyond the size: an end of the file that reads all zeros."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(END_BYTES)
            handle.seek(max(0, size - END_BYTES))
            tail = handle.read(END_BYTES)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    for where, block in (("start", head), ("end", tail)):
        if block and not any(block):
            return f"reads as zeros at its {where} (its data was lost, as in a power loss before it was synced)"
    return None


def check_sample_file(path: Path, size: int, checksum: str | None, with_checksum: bool = True) -> str | None:
    """None when the file at ``path`` is what samples.jsonl recorded; else what is wrong with it."""
    try:
        actual = path.stat().st_size
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if actual != size:
        return f"has {actual} bytes, samples.jsonl recorded {size} (truncated or overwritten)"
    if not with_checksum:
        return _zeroed_end(path, size)
    if checksum is None:
        return "has no checksum in samples.jsonl (written by an older hsextract)" if with_checksum else None
    if with_checksum:
        try:
            actual_sum = file_checksum(path)
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        if actual_sum != checksum:
            return "does not match the checksum samples.jsonl recorded (its bytes changed after it was written)"
    return None
