"""How much a run has to do, without holding up its first request.

A full pass over a large dataset (JSON decoding and validating every token of hundreds of thousands
of rows) takes minutes. :meth:`Planner.estimate` reads only the first rows and scales them to the
whole dataset (by bytes for JSONL, by the stored row count for Parquet and ``save_to_disk``
directories): that figure feeds the free-disk check before any work starts. The exact figures are
counted on a background thread while requests already flow (:meth:`Planner.start`); they replace
the estimate in the metrics and progress once known, and in ``data_config.json`` at the end.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hsextract.errors import BadSampleError
from hsextract.extract.planning.dataset import dataset_kind, validate_row

log = logging.getLogger(__name__)

SAMPLE_ROWS = 500  # rows the estimate decodes at most
SAMPLE_BYTES = 64 << 20  # JSONL bytes the estimate reads at most


@dataclass(frozen=True)
class Plan:
    rows_in_shard: int
    todo_rows: int
    todo_tokens: int
    settled: int
    truncated_rows: int = 0  # rows to extract that are longer than max_seq_len
    longest_tokens: int = 0  # the longest sample the output will hold (after truncation)
    over_trainer_default: int = 0  # samples longer than the trainer's default length
    exact: bool = True  # False: scaled from the first rows (the length figures are those rows')


class _Count:
    """Running totals over rows to extract, plus the lengths of samples written before."""

    def __init__(self, written_lengths: list[int], trainer_default: int) -> None:
        self.rows = self.todo = self.tokens = self.settled = self.truncated = 0
        self.longest = max(written_lengths, default=0)
        self.trainer_default = trainer_default
        self.over_default = sum(1 for n in written_lengths if n > trainer_default)

    def add(self, tokens: int, truncated: bool) -> None:
        self.todo += 1
        self.tokens += tokens
        self.truncated += truncated
        self.longest = max(self.longest, tokens)
        self.over_default += tokens > self.trainer_default

    def plan(self) -> Plan:
        return Plan(self.rows, self.todo, self.tokens, self.settled, self.truncated, self.longest, self.over_default, exact=True)


class Planner:
    """Counts one shard's rows and tokens still to do; rows in ``settled`` are done already."""

    def __init__(
        self,
        dataset: Path,
        shard_rows: Callable[[], Iterator[tuple[int, object]]],
        settled: set[int],
        vocab_size: int,
        max_seq_len: int,
        num_shards: int = 1,
        stop: threading.Event | None = None,
        written_lengths: list[int] | None = None,
        trainer_default: int = 0,
    ) -> None:
        self.dataset = Path(dataset)
        self._shard_rows = shard_rows
        self._settled = frozenset(settled)  # a snapshot: rows this run writes are still to do here
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.num_shards = num_shards
        self._stop = stop or threading.Event()
        self._written_lengths = list(written_lengths or [])
        self._trainer_default = trainer_default
        self._estimate: Plan | None = None
        self._exact: Plan | None = None
        self._thread: threading.Thread | None = None

    # -- up front ---------------------------------------------------------------------------------
    def estimate(self) -> Plan:
        """Exact when the shard has at most a sample's worth of rows; else scaled from the first rows."""
        count = _Count(self._written_lengths, self._trainer_default)
        for row, raw in itertools.islice(self._shard_rows(), SAMPLE_ROWS + 1):
            if count.rows == SAMPLE_ROWS:
                break  # there is more than the sample
            self._add(count, row, raw)
        else:
            self._estimate = self._exact = count.plan()
            return self._exact
        total = self._estimated_shard_rows(count.rows)
        settled_total = len(self._settled)
        valid = count.todo / max(1, count.rows - count.settled)
        todo_rows = round(max(0, total - settled_total) * valid)
        tokens = round(todo_rows * count.tokens / max(1, count.todo))
        sampled = count.plan()
        self._estimate = Plan(
            total,
            todo_rows,
            tokens,
            settled_total,
            sampled.truncated_rows,
            sampled.longest_tokens,
            sampled.over_trainer_default,
            exact=False,
        )
        return self._estimate

    def _add(self, count: _Count, row: int, raw: object) -> None:
        count.rows += 1
        if row in self._settled:
            count.settled += 1
            return
        try:
            sample = validate_row(row, raw, self.vocab_size, self.max_seq_len)
        except BadSampleError:
            return
        count.add(len(sample.input_ids), sample.truncated)

    def _estimated_shard_rows(self, sampled: int) -> int:
        kind = dataset_kind(self.dataset)
        if kind == "jsonl":
            total = _estimate_jsonl_rows(self.dataset)
        elif kind == "parquet":
            import pyarrow.parquet as pq

            total = int(pq.ParquetFile(self.dataset).metadata.num_rows)
        else:
            import datasets

            loaded = datasets.load_from_disk(str(self.dataset))
            total = len(loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded)
        return max(sampled, -(-total // self.num_shards))

    # -- in the background -----------------------------------------------------------------------
    def start(self, on_exact: Callable[[Plan], None] | None = None) -> None:
        """Count the exact plan on a daemon thread; ``on_exact`` gets it (not when stopped first)."""
        if self._exact is not None:
            if on_exact is not None:
                on_exact(self._exact)
            return

        def run() -> None:
            try:
                plan = self._count()
            except Exception:
                log.exception("counting the exact plan failed; the estimate stands")
                return
            if plan is None:
                return
            self._exact = plan
            log.info(
                "exact plan: %d rows in this shard, %d already settled, %d to extract (%d tokens)",
                plan.rows_in_shard,
                plan.settled,
                plan.todo_rows,
                plan.todo_tokens,
            )
            if on_exact is not None:
                on_exact(plan)

        self._thread = threading.Thread(target=run, name="hsextract-plan", daemon=True)
        self._thread.start()

    def _count(self) -> Plan | None:
        count = _Count(self._written_lengths, self._trainer_default)
        for row, raw in self._shard_rows():
            if self._stop.is_set():
                return None
            self._add(count, row, raw)
        return count.plan()

    def result(self) -> Plan:
        """The exact plan once counted (waits for the counter unless the run was stopped), else the estimate."""
        if self._thread is not None and not self._stop.is_set():
            self._thread.join()
        if self._exact is not None:
            return self._exact
        if self._estimate is None:
            raise RuntimeError("Planner.result() before estimate()")
        return self._estimate


def _estimate_jsonl_rows(path: Path) -> int:
    """Rows of a JSONL file: lines in its first bytes, scaled to its size."""
    size = path.stat().st_size
    lines = read = 0
    with open(path, "rb") as handle:
        for line in handle:
            read += len(line)
            if line.strip():
                lines += 1
            if read >= SAMPLE_BYTES:
                break
    if read >= size:
        return lines
    return round(lines * size / max(1, read))
