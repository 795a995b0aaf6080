"""Assemble per-request hidden-state rows from extend passes and write complete dumps.

The one code path between a forward pass and the dump contract, shared by the SGLang hook and
the embedded server. A forward hands over one extend batch at a time (rows of several requests,
each request's rows starting at its prefix length); the sink keys rows by (rid, position), and
when every position of a rid's expected length is present it writes the dump. Assembly and file
writing run on a background thread behind a bounded queue, so the forward thread only enqueues.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract.contract.dumps import DumpSource, write_dump, write_error_marker
from hsextract.contract.rids import DEFAULT_PREFIX, parse_rid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    """One request's rows in an extend batch."""

    rid: str
    prefix_len: int  # tokens of this request already processed in earlier passes
    start_row: int  # first row of this request in the batch tensors
    num_rows: int


@dataclass
class ExtendBatch:
    """The rows of one extend pass, on the host (or being copied there: see ``ready``).

    ``aux`` is ``[n, K, H]``, ``final`` is ``[n, H]`` (post-norm), ``input_ids`` is ``[n]``;
    ``final_prenorm`` (``[n, H]``, the last layer's output before the final norm) is optional.
    ``ready`` (a CUDA event or anything with ``synchronize()``) is waited on before reading;
    ``release`` is called once the tensors are no longer needed (returns a pinned buffer).
    """

    segments: Sequence[Segment]
    input_ids: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor
    final_prenorm: torch.Tensor | None = None
    ready: Any = None
    release: Callable[[], None] | None = None


@dataclass
class _Pending:
    input_ids: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor
    filled: torch.Tensor
    final_prenorm: torch.Tensor | None = None
    chunks: int = 0
    first_seen: float = field(default_factory=time.monotonic)


class DumpSink:
    """Background assembler and writer of dumps under ``root``."""

    def __init__(
        self,
        root: Path,
        source: DumpSource,
        rid_prefix: str = DEFAULT_PREFIX,
        queue_size: int = 8,
        stale_after_s: float = 3600.0,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.source = source
        self.rid_prefix = rid_prefix
        self.stale_after_s = stale_after_s
        self._queue: queue.Queue[ExtendBatch | None] = queue.Queue(maxsize=queue_size)
        self._pending: dict[str, _Pending] = {}
        self.dumps_failed = 0
        self._thread = threading.Thread(target=self._run, name="hsextract-dump-writer", daemon=True)
        self._thread.start()

    # -- called from the forward thread -------------------------------------------------------
    def wants(self, rid: object) -> bool:
        """Whether a rid is one this sink dumps (cheap; lets callers skip copying other rows)."""
        return parse_rid(rid, self.rid_prefix) is not None

    def submit(self, batch: ExtendBatch) -> None:
        """Enqueue one extend batch; blocks only when the queue is full (back-pressure)."""
        self._queue.put(batch)

    def flush(self) -> None:
        """Wait until every submitted batch has been assembled and written."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    # -- background thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._consume(batch)
            except Exception:  # never let one bad batch stop the writer thread
                log.exception("dump writer failed on a batch")
            finally:
                self._queue.task_done()

    def _consume(self, batch: ExtendBatch) -> None:
        try:
            if batch.ready is not None:
                batch.ready.synchronize()
            for segment in batch.segments:
                self._add(segment, batch)
        finally:
            if batch.release is not None:
                batch.release()
        self._evict_stale()

    def _add(self, seg: Segment, batch: ExtendBatch) -> None:
        rid = parse_rid(seg.rid, self.rid_prefix)
        if rid is None or seg.num_rows <= 0:
            return  # health checks, warm-up, foreign rids: never dumped, never a path
        name = str(rid)
        end = seg.prefix_len + seg.num_rows
        if seg.prefix_len < 0 or end > rid.num_tokens:
            self._fail(
                name,
                f"request brought positions {seg.prefix_len}..{end - 1} but its rid promises "
                f"{rid.num_tokens} tokens; the rid's token count is wrong",
            )
            return
        rows = slice(seg.start_row, seg.start_row + seg.num_rows)
        if seg.prefix_len == 0 and seg.num_rows == rid.num_tokens:
            # Whole prompt in one pass (the common case): no assembly copy.
            prenorm = None if batch.final_prenorm is None else batch.final_prenorm[rows]
            self._write(name, batch.input_ids[rows], batch.aux[rows], batch.final[rows], prenorm, chunks=1)
            return
        pending = self._pending.get(name)
        if pending is None:
            aux_shape = (rid.num_tokens, *batch.aux.shape[1:])
            pending = _Pending(
                input_ids=torch.zeros(rid.num_tokens, dtype=torch.int64),
                aux=torch.empty(aux_shape, dtype=batch.aux.dtype),
                final=torch.empty((rid.num_tokens, batch.final.shape[-1]), dtype=batch.final.dtype),
                filled=torch.zeros(rid.num_tokens, dtype=torch.bool),
                final_prenorm=None
                if batch.final_prenorm is None
                else torch.empty((rid.num_tokens, batch.final.shape[-1]), dtype=batch.final.dtype),
            )
            self._pending[name] = pending
        positions = slice(seg.prefix_len, end)
        # Same (rid, position) written twice (a retracted request prefilled again) overwrites
        # with identical values: idempotent.
        pending.input_ids[positions] = batch.input_ids[rows]
        pending.aux[positions] = batch.aux[rows]
        pending.final[positions] = batch.final[rows]
        if pending.final_prenorm is not None and batch.final_prenorm is not None:
            pending.final_prenorm[positions] = batch.final_prenorm[rows]
        pending.filled[positions] = True
        pending.chunks += 1
        if bool(pending.filled.all()):
            del self._pending[name]
            self._write(name, pending.input_ids, pending.aux, pending.final, pending.final_prenorm, pending.chunks)

    def _write(
        self,
        rid: str,
        input_ids: torch.Tensor,
        aux: torch.Tensor,
        final: torch.Tensor,
        final_prenorm: torch.Tensor | None,
        chunks: int,
    ) -> None:
        try:
            write_dump(self.root, rid, input_ids, aux, final, self.source, final_prenorm, extend_passes=chunks)
        except Exception as exc:  # disk full, permissions: report through the marker, keep serving
            log.error("writing dump %s failed: %s", rid, exc)
            self._fail(rid, f"writing the dump failed: {exc}")

    def _fail(self, rid: str, reason: str) -> None:
        self.dumps_failed += 1
        self._pending.pop(rid, None)
        try:
            write_error_marker(self.root, rid, reason)
        except Exception as exc:
            log.error("could not even write the error marker for %s: %s (%s)", rid, exc, reason)

    def _evict_stale(self) -> None:
        now = time.monotonic()
        for name in [n for n, p in self._pending.items() if now - p.first_seen > self.stale_after_s]:
            self._fail(name, f"incomplete after {self.stale_after_s:.0f} s: some extend passes never arrived")
