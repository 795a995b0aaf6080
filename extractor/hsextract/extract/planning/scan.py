"""One pass over the dataset before anything is sent: each row of this shard's content hash, and the
dataset's fingerprint (over every row's hash, in order). For JSONL it hashes lines without decoding
them, so it stays a read at disk speed; the plan's token counts are the planner's (``plan.py``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.extract.planning.dataset import iter_row_digests

_CHECK_STOP_EVERY = 4096


@dataclass
class DatasetScan:
    path: Path
    fingerprint: str
    total_rows: int
    row_hashes: dict[int, str] = field(default_factory=dict)  # every row of this shard


def scan_dataset(path: Path, shard_index: int, num_shards: int, check_stop: Callable[[], None] = lambda: None) -> DatasetScan:
    fingerprint = hashlib.sha256()
    scan = DatasetScan(path=Path(path).resolve(), fingerprint="", total_rows=0)
    for row, digest in iter_row_digests(path):
        if row % _CHECK_STOP_EVERY == 0:
            check_stop()
        fingerprint.update(f"{row}:{digest}\n".encode())
        scan.total_rows += 1
        if row % num_shards == shard_index:
            scan.row_hashes[row] = digest
    scan.fingerprint = "sha256:" + fingerprint.hexdigest()
    return scan
