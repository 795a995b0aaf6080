"""One pass over the dataset before anything is sent: each row of this shard's content hash and
token count, and the dataset's fingerprint (over every row's hash, in order)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.errors import BadSampleError
from hsextract.extract.dataset import iter_rows, validate_row

_CHECK_STOP_EVERY = 1024


@dataclass
class DatasetScan:
    path: Path
    fingerprint: str
    total_rows: int
    row_hashes: dict[int, str] = field(default_factory=dict)  # every row of this shard
    tokens: dict[int, int] = field(default_factory=dict)  # valid rows of this shard: tokens after truncation
    truncated: set[int] = field(default_factory=set)  # valid rows of this shard longer than max_seq_len


def scan_dataset(
    path: Path,
    shard_index: int,
    num_shards: int,
    vocab_size: int,
    max_seq_len: int,
    check_stop: Callable[[], None] = lambda: None,
) -> DatasetScan:
    fingerprint = hashlib.sha256()
    scan = DatasetScan(path=Path(path).resolve(), fingerprint="", total_rows=0)
    for item in iter_rows(path):
        if item.row % _CHECK_STOP_EVERY == 0:
            check_stop()
        fingerprint.update(f"{item.row}:{item.digest}\n".encode())
        scan.total_rows += 1
        if item.row % num_shards != shard_index:
            continue
        scan.row_hashes[item.row] = item.digest
        with contextlib.suppress(BadSampleError):
            sample = validate_row(item.row, item.raw, vocab_size, max_seq_len)
            scan.tokens[item.row] = len(sample.input_ids)
            if sample.truncated:
                scan.truncated.add(item.row)
    scan.fingerprint = "sha256:" + fingerprint.hexdigest()
    return scan
