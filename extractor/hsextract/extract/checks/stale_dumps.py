"""Dumps nobody will read: those of requests that timed out or were cancelled land after the
extractor gave up on them. Each run removes the ones of its own shard's rows at its start and end."""

from __future__ import annotations

import os
from pathlib import Path

from hsextract.contract.files.dumps import remove_dump
from hsextract.contract.rids import parse_rid


def sweep_stale_dumps(dump_dir: Path, rid_prefix: str, shard_index: int, num_shards: int) -> int:
    """Remove dumps (and symlinks or files named like one) of this shard's rows; return how many."""
    removed = 0
    try:
        entries = list(os.scandir(dump_dir))
    except OSError:
        return 0
    for entry in entries:
        rid = parse_rid(entry.name, rid_prefix)
        if rid is not None and rid.row % num_shards == shard_index:
            remove_dump(Path(dump_dir) / entry.name)
            removed += 1
    return removed
