"""One row, start to finish: send its request, wait for its dump or its answer, check, write.

The dump, not the HTTP answer, finishes a row. While the request is open the worker also watches
the row's dump directory; once the dump is complete it goes on (reads, checks and writes it)
whether or not the answer has come. An answer that has not followed ``answer_grace_s`` later is
logged once, counted (``hsextract_late_answers_total``) and cancelled, never waited on; a row that
shares its POST with others is answered once all of them are dumped, so its grace runs from the last
of them (:meth:`RowWorker._settle_answer`). The
other way round, an answer without a dump waits ``dump_timeout_s`` for it (the SGLang hook writes
after answering). What a failure means (retry, skip the row, stop the run) is the error's own
``fatal`` / ``retryable`` (:mod:`hsextract.errors`), with two kinds that spend no try: a server that
takes no connections is waited for (:mod:`hsextract.extract.requests.server_gate`), and a rid the server
still holds from an earlier request (cancelled, or unfinished) is sent again once it is let go.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path

from hsextract.contract.files.dumps import Dump, dump_state, read_error, remove_dump
from hsextract.contract.generate import GenerateRequest
from hsextract.contract.rids import make_rid
from hsextract.contract.states import DumpState, ErrorReason
from hsextract.durable.atomic import disk_full_text
from hsextract.errors import (
    BadSampleError,
    DiskFullError,
    DumpError,
    HsextractError,
    RidInUseError,
    ServerUnreachableError,
    SpotCheckMismatchError,
    TransientServerError,
)
from hsextract.extract.checks.dump_checks import Expectations
from hsextract.extract.checks.spot_check import SpotChecker
from hsextract.extract.config import ExtractConfig
from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.pack_processes import PackProcesses
from hsextract.extract.packing import Packed, PackJob, pack_row, read_checked, sync_sample_file, write_and_sync
from hsextract.extract.requests.client import PendingAnswer, ServerClient
from hsextract.extract.requests.open_requests import OpenRequest, OpenRequests
from hsextract.extract.requests.server_gate import ServerGate
from hsextract.extract.setup import RunSetup
from hsextract.output.formats.base import OutputFormat
from hsextract.output.sample import Sample

log = logging.getLogger(__name__)

#: polling the dump directory while the request is open: first after this, then doubling up to the cap
FIRST_POLL_S = 0.1
MAX_POLL_S = 0.25
#: rows packed on row threads at once, beside those the pack processes hold. Packing is Python under the one interpreter
#: lock, which it lets go around every system call and torch operation: with 256 rows in flight, every row thread whose
#: dump was in took and gave back the lock in turn, and the switches cost more than the work (``make bench-row-cost``:
#: the extractor's CPU a short row 3.3 ms, against 1.8 with 32 in flight; a wide row's finite check, a lock handover
#: every 512 KiB, held 46 threads at once on one H200, bench/results-gpu-e2e-wide-turns.json)
ROWS_PACKED_ON_THREADS = 2
#: how long a row waits for the server to let go of an earlier request of its rid: SGLang notices a
#: closed connection within about 4 s (SGLANG_REQUEST_STATE_WAIT_TIMEOUT) and then aborts it; the
#: embedded server holds it until that forward is done
RID_RELEASE_TIMEOUT_S = 60.0
#: waiting for a dump after the answer (normally milliseconds): how often to check the server is still up
LIVENESS_PROBE_S = 10.0


class _Resend(Exception):
    """The watchdog cancelled this request to send it again (not an attempt that failed)."""


class RowWorker:
    """Processes rows on the calling thread; one instance serves every worker thread of a run."""

    def __init__(
        self,
        setup: RunSetup,
        client: ServerClient,
        ledger: Ledger,
        metrics: ExtractMetrics,
        expectations: Expectations,
        open_requests: OpenRequests,
        gate: ServerGate,
        spot: SpotChecker | None = None,
        packer: PackProcesses | None = None,
    ) -> None:
        self.setup = setup
        self.spot = spot
        self.config: ExtractConfig = setup.config
        self.client = client
        self.ledger = ledger
        self.metrics = metrics
        self.fmt: OutputFormat = setup.fmt
        self.dump_dir: Path = setup.dump_dir
        self.expectations = expectations
        self.packer = packer  # None: every row is packed on its own thread
        self.open_requests = open_requests
        self.gate = gate
        self.final_prenorm = setup.final_prenorm
        #: asked per request (GenerateRequest.storage) of a server that says fp8_per_request; None: not asked
        self.storage = setup.request_storage
        self.stop: threading.Event = ledger.stop
        self._lock = threading.Lock()
        # rows written before their answer came: the row and when its grace ends (time.monotonic)
        self._lingering: dict[PendingAnswer, tuple[OpenRequest, float]] = {}
        # rows packed at once: as many as the pack processes hold and ROWS_PACKED_ON_THREADS more (it says why)
        self._pack_turns = threading.Semaphore(ROWS_PACKED_ON_THREADS + (packer.jobs if packer is not None else 0))

    def process(self, sample: Sample, row_hash: str) -> None:
        rid = make_rid(sample.row, len(sample.input_ids), self.config.rid_prefix)
        entry = self.open_requests.open(sample.row, rid, self.dump_dir / rid)
        try:
            self._attempts(sample, row_hash, entry, self.spot is not None and self.spot.due())
        finally:
            self.open_requests.close(entry)

    def _attempts(self, sample: Sample, row_hash: str, entry: OpenRequest, spot_check: bool) -> None:
        cfg = self.config
        directory = entry.directory
        last_error: HsextractError | None = None
        attempt = 0
        while attempt < cfg.max_attempts:
            if self.stop.is_set():
                return  # abandoned: not recorded, so the next run does it
            attempt += 1
            remove_dump(directory)
            started = time.monotonic()
            try:
                pending = self._send_until_dump(sample, entry)
                if spot_check and self.spot is not None:
                    spot_check = False  # once per row
                    packed = self._pack_checked(sample, row_hash, directory, attempt)
                    if packed is None:
                        remove_dump(directory)
                        return
                else:
                    packed = self._pack(sample, directory)
                self._observe(packed)
            except HsextractError as exc:
                if isinstance(exc, BadSampleError):
                    remove_dump(directory)
                    self.ledger.bad_input(sample.row, row_hash, exc)
                    return
                if exc.fatal:
                    remove_dump(directory)
                    self.ledger.stop_fatal(exc)
                    return
                if not exc.retryable:
                    raise
                if self.stop.is_set():
                    return  # cancelled because the run stops: not a failure
                if entry.pending is not None and not entry.pending.done():
                    entry.pending.cancel()  # the next attempt reuses the rid: the server must not see two at once
                if isinstance(exc, ServerUnreachableError):
                    if not self.gate.wait_until_back(exc):
                        return  # the run stops: not recorded, so the next run does it
                    attempt -= 1  # the server was away: this try does not count
                    continue
                self._count_failure(exc)
                last_error = exc
            else:
                assert packed.written is not None
                self.ledger.written(self.fmt.relative(sample.row), sample, row_hash, packed.written, time.monotonic() - started)
                if not pending.done():
                    self._leave_answer(pending, entry)
                return
            log.warning("row %d attempt %d/%d failed: %s", sample.row, attempt, cfg.max_attempts, last_error)
            if attempt < cfg.max_attempts:
                self.metrics.retries.inc()
                self.stop.wait(min(30.0, 0.5 * 2**attempt))
        remove_dump(directory)
        if not self.stop.is_set():
            self.ledger.failed(sample.row, row_hash, last_error)

    # -- packing --------------------------------------------------------------------------------------
    def _pack(self, sample: Sample, directory: Path) -> Packed:
        """Read, check and write the row's complete dump: it waits for one of ``_pack_turns``, then goes to a pack
        process with room for it once the run knows what every dump must be, else to this thread."""
        output = self.config.output
        with self.metrics.stage("turn"):
            self._pack_turns.acquire()
        try:
            expect = self.expectations.known()
            packed = None if self.packer is None or expect is None else self.packer.pack(PackJob(sample, directory, expect))
            if packed is not None:
                self.metrics.packed_in_process.inc()
            else:
                packed = pack_row(self.fmt, output, sample, directory, self.expectations, sync=False)
        finally:
            self._pack_turns.release()
        sync_sample_file(self.fmt, output, sample, packed)  # outside: a slow disk's fsyncs run in parallel
        return packed

    def _pack_checked(self, sample: Sample, row_hash: str, directory: Path, attempt: int) -> Packed | None:
        """A spot-checked row, on this thread (the check compares the dump it read): None when it is not written."""
        packed = Packed()
        dump = read_checked(directory, sample, self.expectations, packed)
        if not self._spot_check_passes(sample, row_hash, dump, attempt):
            return None
        write_and_sync(self.fmt, self.config.output, sample, dump, directory, packed)
        return packed

    def _observe(self, packed: Packed) -> None:
        for stage, seconds in packed.seconds.items():
            self.metrics.stage_seconds.labels(stage).observe(seconds)
        if packed.picked_up_after_s is not None:
            self.ledger.dump_picked_up(packed.picked_up_after_s)

    def _spot_check_passes(self, sample: Sample, row_hash: str, dump: Dump, attempt: int) -> bool:
        """False when the engine's own states differ from the dump (the ledger has recorded the row) or the run
        stops before the check could be made (nothing recorded: the next run does the row)."""
        assert self.spot is not None
        comparison = self.spot.check(sample, dump, attempt)
        if comparison is None:  # the request failed (counted), or the run stops (the row is left for the next run)
            return not self.stop.is_set()
        if comparison.ok:
            return True
        self.ledger.spot_check_mismatch(
            sample.row,
            row_hash,
            SpotCheckMismatchError(
                f"the engine's own hidden states of row {sample.row} (return_hidden_states, its first "
                f"{min(len(sample.input_ids), self.spot.max_tokens)} tokens) differ from its dump {dump.rid} at "
                f"{comparison.describe()}; the row is not written"
            ),
        )
        return False

    def _count_failure(self, exc: HsextractError) -> None:
        if isinstance(exc, TransientServerError):
            self.metrics.server_up.set(1 if self.client.healthy() else 0)
            self.metrics.errors.labels(ErrorReason.SERVER).inc()
        elif isinstance(exc, DumpError):
            self.metrics.errors.labels(exc.reason).inc()

    # -- one request ----------------------------------------------------------------------------------
    def _send_until_dump(self, sample: Sample, entry: OpenRequest) -> PendingAnswer:
        """Send the row's request (again, when the watchdog asks) until its dump is complete."""
        request = GenerateRequest(entry.rid, sample.input_ids, self.final_prenorm, self.storage)
        held_since: float | None = None
        delay = 0.25
        while True:
            pending = self.client.send_prefill(request)
            entry.sent(pending)
            try:
                self._await_dump(pending, entry.directory, entry)
                return pending
            except _Resend:
                pending.cancel()
                log.info("row %d: sent again by the watchdog (the server had no trace of it)", sample.row)
                remove_dump(entry.directory)
            except RidInUseError:
                # An earlier request of this rid is cancelled but not yet let go, or unfinished; it may
                # still complete the dump, which finishes the row just as well.
                now = time.monotonic()
                if held_since is None:
                    held_since = now
                    log.info("row %d: the server still holds an earlier request of %s; sending again once it lets go",
                             sample.row, entry.rid)  # fmt: skip
                elif now - held_since > RID_RELEASE_TIMEOUT_S:
                    raise
                if self.stop.wait(delay):
                    raise DumpError(ErrorReason.INTERRUPTED, "run stopping") from None
                delay = min(delay * 2, 4.0)
                if dump_state(entry.directory) is DumpState.DONE:
                    return pending

    def _await_dump(self, pending: PendingAnswer, directory: Path, entry: OpenRequest) -> None:
        """Wait for the answer while watching the dump, until the dump is complete; the dump wins either way."""
        delay = FIRST_POLL_S
        with self.metrics.stage("request"):
            while not pending.wait(delay):
                if self.stop.is_set():
                    pending.cancel()
                    raise DumpError(ErrorReason.INTERRUPTED, "run stopping")
                if entry.take_resend():
                    raise _Resend
                state = dump_state(directory)
                if state is DumpState.DONE:
                    self.metrics.stage_seconds.labels("wait_dump").observe(0.0)  # the dump came first
                    return
                if state is DumpState.ERROR:
                    raise self._server_dump_error(directory)
                delay = min(delay * 2, MAX_POLL_S)
        if entry.take_resend():
            raise _Resend
        try:
            pending.result()
        except TransientServerError as exc:
            state = dump_state(directory)
            if state is DumpState.DONE:  # the request failed, but its dump is complete
                return
            if state is DumpState.ERROR:
                raise self._server_dump_error(directory) from exc
            if disk_full_text(str(exc)):  # the embedded server's answer: a full filesystem took the marker too
                raise self._server_dump_error(directory, str(exc)) from exc
            raise
        self.metrics.server_up.set(1)
        with self.metrics.stage("wait_dump"):
            self._wait_for_dump(directory)

    def _wait_for_dump(self, directory: Path) -> None:
        """After the answer: the SGLang hook writes on a background thread, so the dump can land later."""
        now = time.monotonic()
        deadline = now + self.config.dump_timeout_s
        next_probe = now + LIVENESS_PROBE_S
        delay = 0.002
        while True:
            state = dump_state(directory)
            if state is DumpState.DONE:
                return
            if state is DumpState.ERROR:
                raise self._server_dump_error(directory)
            now = time.monotonic()
            if now >= next_probe:  # a server killed after answering never writes this dump
                next_probe = now + LIVENESS_PROBE_S
                if not self.client.reachable():
                    raise ServerUnreachableError(
                        f"the server answered {directory.name}, then stopped taking connections before its dump was "
                        "written (killed or restarted): it is sent again once the server is back"
                    )
            if now > deadline:
                raise DumpError(
                    ErrorReason.DUMP_TIMEOUT,
                    f"no dump appeared at {directory} within {self.config.dump_timeout_s:.0f} s after the request "
                    "returned; is dump_dir the directory the server writes to (same host, same /dev/shm)?",
                )
            if self.stop.wait(delay):
                raise DumpError(ErrorReason.INTERRUPTED, "run stopping")
            delay = min(delay * 2, 0.05)

    @staticmethod
    def _server_dump_error(directory: Path, reason: str | None = None) -> HsextractError:
        """What the server's failed dump means: its ``error`` marker's reason, or the one its answer gave."""
        reason = read_error(directory) if reason is None else reason
        if disk_full_text(reason):
            return DiskFullError(
                f"the server could not write dump {directory.name}: its dump filesystem ({directory.parent}) is "
                f"full ({reason}). Free space there or lower --concurrency (docs/runbooks/shm-full.md), then "
                "rerun the same command to resume"
            )
        return DumpError(ErrorReason.SERVER_DUMP_ERROR, f"the server could not dump {directory.name}: {reason}")

    def _leave_answer(self, pending: PendingAnswer, entry: OpenRequest) -> None:
        """The row is written from its dump; its answer gets ``answer_grace_s`` more, then is counted late. The
        grace starts again while another row of its POST is not dumped: the POST is answered once all are."""
        pending.dumped()
        with self._lock:
            self._lingering[pending] = (entry, time.monotonic() + self.config.answer_grace_s)
        self._settle_after_grace(pending)

    def _settle_after_grace(self, pending: PendingAnswer) -> None:
        """:meth:`_settle_answer` once ``answer_grace_s`` has passed; scheduled outside ``_lock``, which every
        dumped row takes (the timer's own lock and wake-up stay out of it)."""
        self.client.later(self.config.answer_grace_s, functools.partial(self._settle_answer, pending))

    def _settle_answer(self, pending: PendingAnswer, final: bool = False) -> None:
        renewed = False
        with self._lock:
            lingering = self._lingering.pop(pending, None)
            if lingering is not None and not pending.done() and not final and pending.waits_for_other_rows():
                self._lingering[pending] = (lingering[0], time.monotonic() + self.config.answer_grace_s)
                renewed = True
        if renewed:
            self._settle_after_grace(pending)
            return
        if lingering is not None and not pending.done():
            entry, _ = lingering
            self.ledger.answer_late(entry.row, entry.rid, self.config.answer_grace_s)
            pending.cancel()

    def abandon_answers(self) -> None:
        """The run ends: answers still awaited get the rest of their grace, then count late and are cancelled."""
        with self._lock:
            lingering = list(self._lingering.items())
        for pending, (_, grace_ends) in lingering:
            pending.wait(max(0.0, grace_ends - time.monotonic()))
            self._settle_answer(pending, final=True)
