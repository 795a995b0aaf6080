"""The output, built from the journal once every row is settled: complete rows only, in input order.

OUT is written to a temp name beside it, ``fsync``'d, then moved into place with ``os.replace``: a
reader sees no OUT or the whole one. Then ``errors.jsonl`` (every failed or skipped row with its
reason) and last ``summary.json`` (counts, identity, server) go into the journal directory.
JSONL is streamed row by row from the journal; Parquet is built in memory (one table) first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes, remove_quietly, temp_path
from hsextract.durable.sync import sync_dir, sync_file, sync_handle
from hsextract.regen.journal import ERRORS_FILE, OK, SUMMARY_FILE, Journal


def _ok_rows(journal: Journal, rows: Sequence[int]) -> Iterator[dict[str, Any]]:
    for row in rows:
        settled = journal.settled[row]
        if settled.status == OK:
            yield journal.record(row)["output"]


def _write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    count = 0
    with open(path, "wb") as handle:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False, default=str) + "\n").encode())
            count += 1
        sync_handle(handle)
    return count


def _write_parquet(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    pq.write_table(table, path)
    sync_file(path)
    return int(table.num_rows)


def write_rows(output: Path, rows: Iterator[dict[str, Any]]) -> int:
    """Write ``rows`` to ``output`` (Parquet when it ends in .parquet, else JSONL) under a temp name, fsync'd,
    then ``os.replace`` it into place; return how many rows it holds."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(output)
    try:
        count = _write_parquet(tmp, rows) if output.suffix == ".parquet" else _write_jsonl(tmp, rows)
        os.replace(tmp, output)
        sync_dir(output.parent)
    except BaseException:
        remove_quietly(tmp)
        raise
    return count


def write_output(output: Path, journal: Journal, rows: Sequence[int]) -> int:
    """Write OUT from the journal's ok rows; return how many rows it holds."""
    return write_rows(output, _ok_rows(journal, rows))


def write_errors(journal: Journal, rows: Sequence[int]) -> int:
    """``errors.jsonl``: one line per failed or skipped row, in input order; return how many."""
    lines = []
    for row in rows:
        if journal.settled[row].status != OK:
            record = journal.record(row)
            lines.append(json.dumps({k: record.get(k) for k in ("row", "id", "status", "reason", "message")},
                                    ensure_ascii=False, default=str))
    atomic_write_bytes(journal.directory / ERRORS_FILE, "".join(line + "\n" for line in lines).encode())
    return len(lines)


def write_summary(journal_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json`` of a journal directory, atomically: written last, it marks the output complete."""
    atomic_write_bytes(Path(journal_dir) / SUMMARY_FILE, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())


def read_summary(journal_dir: Path) -> dict[str, Any] | None:
    path = Path(journal_dir) / SUMMARY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
