"""Assemble per-request hidden-state rows from extend passes and write complete dumps.

The one code path between a forward pass and the dump contract, shared by the SGLang hook and
the embedded server. A forward hands over one extend batch at a time (rows of several requests,
each request's rows starting at its prefix length); the sink keys rows by (rid, position), and
when every position of a rid's expected length is present it writes the dump: stacked ``[aux..., pre-norm
final]`` for a segment that asks for it (speculators' sample layout: written as it is when the engine
stacked the rows on the device, else a few tokens at a time), else aux and the final states apart. Rows of a request
dumped as FP8 (``contract.fp8``, quantized on the device before the copy) travel in the batch's
:class:`Fp8Rows` and assemble the same way: the scale is per token, so chunks are independent; one
batch can carry both kinds of rows, for different requests. An assembler thread
behind a bounded queue waits for each batch's copy and assembles chunks in submission order; a
pool of writer threads writes the dumps, several at once, straight from the batch's host rows.
The forward thread only enqueues.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract.capture.stages import StageClock
from hsextract.contract.files.dump_dir import prepare_dump_root
from hsextract.contract.files.dump_pages import huge_pages_advice
from hsextract.contract.files.dumps import (
    FINAL_SLOT_POSTNORM,
    FINAL_SLOT_PRENORM,
    DumpSource,
    write_dump,
    write_error_marker,
    write_fp8_dump,
    write_stacked_dump,
)
from hsextract.contract.rids import DEFAULT_PREFIX, parse_rid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    """One request's rows in an extend batch."""

    rid: str
    prefix_len: int  # tokens of this request already processed in earlier passes
    start_row: int  # first row of this request in the batch tensors
    num_rows: int
    final_prenorm: bool = True  # its dump holds the pre-norm final state (when the batch carries it)
    # "float8_e4m3fn": the rows are in the batch's Fp8Rows (start_row counts there), and final_prenorm
    # says which final state their last slot holds; None: the model-dtype rows
    storage: str | None = None
    # model-dtype rows with the pre-norm state: dumped stacked [aux..., pre-norm final] without the post-norm state
    # (dumps.write_stacked_dump), for a request that asked for the pre-norm state alone (the embedded server's
    # hsextract_final_prenorm); False: aux, the post-norm final and the pre-norm one apart (the SGLang hook's
    # final_prenorm is the server's, for every request, and such a server may serve both formats)
    stacked: bool = False


@dataclass(frozen=True)
class Fp8Rows:
    """The FP8 rows of one extend batch (``contract.fp8``), in batch order of the FP8 segments."""

    input_ids: torch.Tensor  # [m] int64
    hidden_states: torch.Tensor  # [m, K+1, H] float8_e4m3fn: aux in layer order, then the final state
    scales: torch.Tensor  # [m, 1, 1] float32
    model_dtype: str  # the dtype the model computed in, for meta.json


@dataclass
class ExtendBatch:
    """The rows of one extend pass, on the host (or being copied there: see ``ready``).

    ``aux`` is ``[n, K, H]``, ``final`` is ``[n, H]`` (post-norm), ``input_ids`` is ``[n]``;
    ``final_prenorm`` (``[n, H]``, the last layer's output before the final norm) is optional.
    ``fp8`` holds the rows of the segments with a ``storage`` (the model-dtype tensors then hold
    only the others' rows, possibly none).
    ``ready`` (a CUDA event or anything with ``synchronize()``) is waited on before reading;
    ``spans`` are ``(stage, start, end)`` CUDA event pairs timed once ``ready`` has passed;
    ``release`` is called once the tensors are no longer needed (returns a pinned buffer), then
    ``on_complete`` once every dump this batch completed is written (or marked failed); by then ``failed``
    names each rid whose dump could not be written, and why (its ``error`` marker may not have been
    written either: a full filesystem takes both).
    """

    segments: Sequence[Segment]
    input_ids: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor
    final_prenorm: torch.Tensor | None = None
    ready: Any = None
    release: Callable[[], None] | None = None
    spans: Sequence[tuple[str, Any, Any]] = ()
    on_complete: Callable[[], None] | None = None
    fp8: Fp8Rows | None = None
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fp8Layout:
    model_dtype: str
    final_slot: str


@dataclass
class _Pending:
    """A request's rows so far, by name (``input_ids`` and the layout's tensors), each ``[T, ...]``."""

    tensors: dict[str, torch.Tensor]
    filled: torch.Tensor
    fp8: _Fp8Layout | None
    chunks: int = 0
    first_seen: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Write:
    rid: str
    tensors: dict[str, torch.Tensor]
    fp8: _Fp8Layout | None
    chunks: int


class DumpSink:
    """Background assembler and writers of dumps under ``root``."""

    def __init__(
        self,
        root: Path,
        source: DumpSource,
        rid_prefix: str = DEFAULT_PREFIX,
        queue_size: int = 8,
        stale_after_s: float = 3600.0,
        writers: int = 4,
        clock: StageClock | None = None,
    ) -> None:
        if writers < 1:
            raise ValueError(f"writers must be at least 1, got {writers}")
        self.root = prepare_dump_root(Path(root))  # mode 0700, or an existing one only this user can write
        if advice := huge_pages_advice(self.root):
            log.info("%s", advice)
        self.source = source
        self.rid_prefix = rid_prefix
        self.stale_after_s = stale_after_s
        self.clock = clock if clock is not None else StageClock()
        self._queue: queue.Queue[ExtendBatch | None] = queue.Queue(maxsize=queue_size)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._unfinished = 0  # batches submitted and not yet completed
        # Batches handed to the writers and not yet done: bounds the host memory they hold.
        self._writing = threading.BoundedSemaphore(queue_size)
        self.dumps_failed = 0
        self._writers = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="hsextract-dump-writer")
        self._thread = threading.Thread(target=self._run, name="hsextract-dump-assembler", daemon=True)
        self._thread.start()

    # -- called from the forward thread -------------------------------------------------------
    def wants(self, rid: object) -> bool:
        """Whether a rid is one this sink dumps (cheap; lets callers skip copying other rows)."""
        return parse_rid(rid, self.rid_prefix) is not None

    def submit(self, batch: ExtendBatch) -> None:
        """Enqueue one extend batch; blocks only when the queue is full (back-pressure)."""
        with self._lock:
            self._unfinished += 1
        started = time.perf_counter()
        self._queue.put(batch)
        self.clock.observe("wait_sink", time.perf_counter() - started)

    def flush(self) -> None:
        """Wait until every submitted batch has been assembled and its dumps written."""
        with self._idle:
            while self._unfinished:
                self._idle.wait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._writers.shutdown(wait=True)

    # -- assembler thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._consume(batch)
            except Exception:  # never let one bad batch stop the assembler
                log.exception("dump assembler failed on a batch")
                self._finish(batch)

    def _consume(self, batch: ExtendBatch) -> None:
        if batch.ready is not None:
            started = time.perf_counter()
            batch.ready.synchronize()
            self.clock.observe("wait_copy", time.perf_counter() - started)
            for stage, start, end in batch.spans:
                self.clock.observe(stage, float(start.elapsed_time(end)) / 1e3)
        writes = [write for write in (self._add(segment, batch) for segment in batch.segments) if write is not None]
        self._evict_stale()
        if not writes:
            self._finish(batch)
            return
        self._writing.acquire()
        left = [len(writes)]
        left_lock = threading.Lock()

        def one(write: _Write) -> None:
            try:
                reason = self._write(write)
                if reason is not None:
                    batch.failed[write.rid] = reason
            finally:
                with left_lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    self._writing.release()
                    self._finish(batch)

        for write in writes:
            self._writers.submit(one, write)

    def _finish(self, batch: ExtendBatch) -> None:
        try:
            if batch.release is not None:
                batch.release()
            if batch.on_complete is not None:
                batch.on_complete()
        except Exception:
            log.exception("completing an extend batch failed")
        finally:
            with self._idle:
                self._unfinished -= 1
                if not self._unfinished:
                    self._idle.notify_all()

    def _add(self, seg: Segment, batch: ExtendBatch) -> _Write | None:
        rid = parse_rid(seg.rid, self.rid_prefix)
        if rid is None or seg.num_rows <= 0:
            return None  # health checks, warm-up, foreign rids: never dumped, never a path
        name = str(rid)
        end = seg.prefix_len + seg.num_rows
        if seg.prefix_len < 0 or end > rid.num_tokens:
            self._fail(
                name,
                f"request brought positions {seg.prefix_len}..{end - 1} but its rid promises "
                f"{rid.num_tokens} tokens; the rid's token count is wrong",
            )
            return None
        rows = slice(seg.start_row, seg.start_row + seg.num_rows)
        if seg.storage is not None:
            if batch.fp8 is None:
                self._fail(name, f"segment asks for {seg.storage} storage but its batch carries no FP8 rows (a capture bug)")
                return None
            fp8: _Fp8Layout | None = _Fp8Layout(
                batch.fp8.model_dtype, FINAL_SLOT_PRENORM if seg.final_prenorm else FINAL_SLOT_POSTNORM
            )
            parts = {
                "input_ids": batch.fp8.input_ids[rows],
                "hidden_states": batch.fp8.hidden_states[rows],
                "hidden_states_scales": batch.fp8.scales[rows],
            }
        else:
            fp8 = None
            parts = {"input_ids": batch.input_ids[rows], "aux": batch.aux[rows]}
            prenorm = batch.final_prenorm if seg.final_prenorm else None
            if not (seg.stacked and prenorm is not None):
                parts["final"] = batch.final[rows]  # stacked: left out, the request did not ask for it
            if prenorm is not None:
                parts["final_prenorm"] = prenorm[rows]
        if seg.prefix_len == 0 and seg.num_rows == rid.num_tokens:
            # Whole prompt in one pass (the common case): written from the batch's rows, no copy.
            return _Write(name, parts, fp8, chunks=1)
        pending = self._pending.get(name)
        if pending is None:
            tensors = {key: torch.empty((rid.num_tokens, *t.shape[1:]), dtype=t.dtype) for key, t in parts.items()}
            pending = _Pending(tensors, filled=torch.zeros(rid.num_tokens, dtype=torch.bool), fp8=fp8)
            self._pending[name] = pending
        if (pending.fp8 is None) != (fp8 is None) or pending.tensors.keys() != parts.keys():
            self._fail(name, "request arrived in chunks of different storages or final states; send it with one of each")
            return None
        positions = slice(seg.prefix_len, end)
        # Same (rid, position) written twice (a retracted request prefilled again) overwrites
        # with identical values: idempotent.
        for key, target in pending.tensors.items():
            if key in parts:
                target[positions] = parts[key]
        pending.filled[positions] = True
        pending.chunks += 1
        if not bool(pending.filled.all()):
            return None
        del self._pending[name]
        return _Write(name, pending.tensors, pending.fp8, pending.chunks)

    # -- writer threads ---------------------------------------------------------------------------
    def _write(self, write: _Write) -> str | None:
        """Write one dump; the reason it could not be, if it could not (an ``error`` marker says so too)."""
        started = time.perf_counter()
        t = write.tensors
        try:
            if write.fp8 is not None:
                write_fp8_dump(
                    self.root,
                    write.rid,
                    t["input_ids"],
                    t["hidden_states"],
                    t["hidden_states_scales"],
                    self.source,
                    model_dtype=write.fp8.model_dtype,
                    final_slot=write.fp8.final_slot,
                    extend_passes=write.chunks,
                )
            elif "final" not in t:
                write_stacked_dump(
                    self.root,
                    write.rid,
                    t["input_ids"],
                    t["aux"],
                    t["final_prenorm"],
                    self.source,
                    final_slot=FINAL_SLOT_PRENORM,
                    extend_passes=write.chunks,
                )
            else:
                prenorm = t.get("final_prenorm")
                write_dump(self.root, write.rid, t["input_ids"], t["aux"], t["final"], self.source, prenorm, write.chunks)
        except Exception as exc:  # disk full, permissions: report through the marker, keep serving
            log.error("writing dump %s failed: %s", write.rid, exc)
            reason = f"writing the dump failed: {exc}"
            self._mark_failed(write.rid, reason)
            return reason
        self.clock.observe("dump_write", time.perf_counter() - started)
        self.clock.dumps.inc()
        self.clock.dump_bytes.inc(sum(x.numel() * x.element_size() for x in t.values()))
        return None

    def _fail(self, rid: str, reason: str) -> None:
        self._pending.pop(rid, None)
        self._mark_failed(rid, reason)

    def _mark_failed(self, rid: str, reason: str) -> None:
        with self._lock:
            self.dumps_failed += 1
        try:
            write_error_marker(self.root, rid, reason)
        except Exception as exc:
            log.error("could not even write the error marker for %s: %s (%s)", rid, exc, reason)

    def _evict_stale(self) -> None:
        now = time.monotonic()
        for name in [n for n, p in self._pending.items() if now - p.first_seen > self.stale_after_s]:
            self._fail(name, f"incomplete after {self.stale_after_s:.0f} s: some extend passes never arrived")
