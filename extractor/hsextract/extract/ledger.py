"""The run's ledger: what happened to each row, the counters, and the fatal stop.

Every settled row goes through here: written (``samples.jsonl``), bad input or failed
(``errors.jsonl``), with its metrics. The ledger also counts consecutive failures (the breaker that
stops a run against a broken server), holds the first fatal error, and tells how the run ended
(:meth:`Ledger.outcome`). Worker threads call it concurrently.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

from hsextract.contract.states import ErrorKind, ErrorReason, RunStatus
from hsextract.durable.atomic import is_disk_full
from hsextract.errors import BadSampleError, DiskFullError, HsextractError, ServerError, SpotCheckMismatchError
from hsextract.extract.metrics import ExtractMetrics
from hsextract.output.checksum import WrittenFile
from hsextract.output.manifest import ErrorRecord, Manifest, WrittenSample
from hsextract.output.sample import Sample

log = logging.getLogger(__name__)


def disk_full_error(path: Path, what: str, exc: BaseException) -> DiskFullError:
    """The fatal error for a full filesystem, with its free space and the fix."""
    try:
        free = f"{shutil.disk_usage(path).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(
        f"the filesystem of {what} ({path}, {free}) is full: {exc}. No sample was lost: free space there "
        "(docs/runbooks/disk-full.md), then rerun the same command to resume"
    )


class Ledger:
    """Records settled rows in the manifest and the metrics; owns the breaker and the fatal stop."""

    def __init__(
        self,
        manifest: Manifest,
        metrics: ExtractMetrics,
        output: Path,
        stop: threading.Event,
        *,
        max_attempts: int,
        max_consecutive_failures: int,
        server_url: str,
        max_spot_check_mismatches: int = 3,
    ) -> None:
        self.manifest = manifest
        self.metrics = metrics
        self.output = output
        self.stop = stop
        self._max_attempts = max_attempts
        self._max_consecutive_failures = max_consecutive_failures
        self._server_url = server_url
        self._max_spot_check_mismatches = max_spot_check_mismatches
        self.spot_check_mismatches = 0
        self._lock = threading.Lock()
        self._consecutive_failures = 0
        self.fatal: HsextractError | None = None
        self.interrupted_by: str | None = None
        self.written_now = 0
        self.failed_now = 0
        self.late_answers = 0
        self.longest_dump_pickup_s = 0.0
        self.last_settled = time.monotonic()  # the watchdog's clock: when a row last settled
        self.fanned_out = threading.Event()  # one sample went through: send at full concurrency

    # -- how the run ends -----------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """End the run soon (safe from a signal handler): requests in flight are not failures."""
        if self.interrupted_by is None:
            self.interrupted_by = reason
        self.stop.set()

    def stop_fatal(self, error: HsextractError) -> None:
        with self._lock:
            if self.fatal is None:
                self.fatal = error
        log.error("stopping the run: %s", error)
        self.stop.set()

    def outcome(self) -> tuple[RunStatus, str | None]:
        if self.fatal is not None:
            return RunStatus.STOPPED, self.fatal_text()
        if self.interrupted_by is not None:
            return RunStatus.INTERRUPTED, f"interrupted ({self.interrupted_by}); rerun the same command to resume"
        if self.failed_now:
            return RunStatus.INCOMPLETE, None
        unusable = self._no_usable_row()
        if unusable is not None:
            return RunStatus.STOPPED, unusable
        return RunStatus.COMPLETE, None

    def _no_usable_row(self) -> str | None:
        """Why the run must not end COMPLETE: every row of the shard was bad input, nothing was written."""
        if self.manifest.written:
            return None
        bad = [e for e in self.manifest.errors.values() if e.kind == ErrorKind.BAD_INPUT]
        if not bad:
            return None
        reason, count = Counter(e.reason for e in bad).most_common(1)[0]
        example = next(e for e in bad if e.reason == reason)
        return (
            f"no row of the dataset is usable: all {len(bad)} rows were recorded as bad input in errors.jsonl, {count} of "
            f"them {reason} (e.g. {example.message}). Fix the dataset (conversations must be tokenized first: "
            "hsextract prepare), then rerun"
        )

    def fatal_text(self) -> str | None:
        return None if self.fatal is None else f"{type(self.fatal).__name__}: {self.fatal}"

    # -- settled rows -------------------------------------------------------------------------------
    def written(self, fmt_relative: str, sample: Sample, row_hash: str, written: WrittenFile, seconds: float) -> None:
        record = WrittenSample(
            sample.row,
            fmt_relative,
            len(sample.input_ids),
            sample.original_length,
            written.bytes,
            checksum=written.checksum,
            row_hash=row_hash,
            loss_mask_given=sample.loss_mask_given,
        )
        if not self._append(functools.partial(self.manifest.add_written, record)):
            return
        self.fanned_out.set()
        with self._lock:
            self._consecutive_failures = 0
            self.written_now += 1
            self.last_settled = time.monotonic()
        self.metrics.samples.labels("ok").inc()
        self.metrics.tokens.inc(len(sample.input_ids))
        self.metrics.output_bytes.inc(written.bytes)
        self.metrics.request_seconds.observe(seconds)
        if sample.truncated:
            self.metrics.truncated.inc()
        if not sample.loss_mask_given:
            self.metrics.without_loss_mask.inc()

    def bad_input(self, row: int, row_hash: str, exc: BadSampleError) -> None:
        log.warning("skipping bad row %d: %s", row, exc)
        if not self._append(
            functools.partial(self.manifest.add_error, ErrorRecord(row, ErrorKind.BAD_INPUT, exc.reason, str(exc), row_hash))
        ):
            return
        with self._lock:
            self.last_settled = time.monotonic()
        self.metrics.samples.labels("bad_input").inc()
        self.metrics.errors.labels(exc.reason).inc()

    def failed(self, row: int, row_hash: str, error: Exception | None) -> None:
        reason = getattr(error, "reason", ErrorReason.SERVER)
        if not self._append(
            functools.partial(self.manifest.add_error, ErrorRecord(row, ErrorKind.FAILED, reason, str(error), row_hash))
        ):
            return
        self.metrics.samples.labels("failed").inc()
        with self._lock:
            self.failed_now += 1
            self._consecutive_failures += 1
            failures = self._consecutive_failures
            self.last_settled = time.monotonic()
        if failures >= self._max_consecutive_failures:
            self.stop_fatal(
                ServerError(
                    f"{failures} samples in a row failed after {self._max_attempts} tries each; last error: {error}. "
                    f"Check the server (curl {self._server_url}/health_generate, its log) and that the dump dir is shared "
                    "with it; then rerun the same command to resume"
                )
            )

    def spot_check_mismatch(self, row: int, row_hash: str, error: SpotCheckMismatchError) -> None:
        """A spot-checked row whose dump differs from the engine's own states: recorded, not written
        (a rerun redoes it); after ``max_spot_check_mismatches`` of them the run stops."""
        log.error("row %d: %s", row, error)
        record = ErrorRecord(row, ErrorKind.FAILED, error.reason, str(error), row_hash)
        if not self._append(functools.partial(self.manifest.add_error, record)):
            return
        self.metrics.samples.labels("failed").inc()
        self.metrics.errors.labels(error.reason).inc()
        with self._lock:
            self.failed_now += 1
            self.spot_check_mismatches += 1
            mismatches = self.spot_check_mismatches
            self.last_settled = time.monotonic()
        if mismatches >= self._max_spot_check_mismatches:
            self.stop_fatal(
                SpotCheckMismatchError(
                    f"{mismatches} spot-checked rows differed from the engine's own hidden states (spot_check_max_mismatches "
                    f"{self._max_spot_check_mismatches}); the last: row {row}: {error}. The dumps do not hold what the "
                    "engine computes: check the hook's layers and final norm against the server before going on "
                    "(docs/runbooks/spot-check-mismatch.md), then rerun the same command; the rows in errors.jsonl are redone"
                )
            )

    # -- answers and dumps ----------------------------------------------------------------------------
    def dump_picked_up(self, seconds: float) -> None:
        """A complete dump was taken up ``seconds`` after its ``done`` marker was written."""
        seconds = max(0.0, seconds)
        self.metrics.dump_pickup_seconds.observe(seconds)
        with self._lock:
            self.longest_dump_pickup_s = max(self.longest_dump_pickup_s, seconds)

    def answer_late(self, row: int, rid: str, grace_s: float) -> None:
        """A row was written from its dump and its HTTP answer did not follow within the grace."""
        with self._lock:
            self.late_answers += 1
        self.metrics.late_answers.inc()
        log.warning(
            "row %d (%s): written from its complete dump; the server's HTTP answer had not come %.1f s later and is not "
            "waited on (counted in hsextract_late_answers_total)",
            row,
            rid,
            grace_s,
        )

    def _append(self, write: functools.partial[None]) -> bool:
        """A manifest append; a full disk stops the run (the append was cut back off)."""
        try:
            write()
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            self.stop_fatal(disk_full_error(self.output, "the output", exc))
            return False
        return True
