"""The extraction run: plan, stream requests, verify and pack dumps, record everything.

One instance runs one shard of one dataset into one output directory, holding the output's lock
(``lock.py``). Before the first request it checks the server, the layers and the disk
(``preflight.py``), scans the dataset (``scan.py``), checks this run against the output's identity and
records it (``identity.py``), and verifies what earlier runs wrote (``resume_check.py``). Rerunning
the same command resumes: rows already written from the same row content into an intact file, or
known to be bad input, are skipped; everything else is (re)done, and at one request per forward the
output ends up byte-identical to an uninterrupted run's.

The parts: each row goes through a :class:`~hsextract.extract.row_worker.RowWorker` (send, wait for
the dump or the answer, check, write) on one of ``concurrency`` threads; the
:class:`~hsextract.extract.ledger.Ledger` records what happened to it and holds the counters and the
fatal stop; :class:`~hsextract.extract.requests.open_requests.StallWatchdog` watches the open rows. This
module plans, streams the rows to the workers and writes the summary.

The first request goes alone; the run fans out to ``concurrency`` once one sample is written. A
signal (:meth:`Extraction.request_stop`) or a fatal error cancels the requests in flight (they are
not failures) and the run ends within seconds with its summary and ``data_config.json`` written.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from hsextract.contract.states import RunStatus
from hsextract.durable.atomic import is_disk_full, remove_quietly, sweep_temp_files
from hsextract.durable.lock import OutputLock
from hsextract.errors import BadSampleError, DiskFullError, HsextractError, ServerError
from hsextract.extract.checks.dump_checks import Expectations
from hsextract.extract.checks.dump_folder_lock import take_dump_folder_lock
from hsextract.extract.checks.spot_check import SpotChecker
from hsextract.extract.checks.stale_dumps import sweep_stale_dumps
from hsextract.extract.config import ExtractConfig
from hsextract.extract.ledger import Ledger, disk_full_error
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.outcome import RunSummary, build_data_config, summarize, trainable
from hsextract.extract.pack_processes import PackProcesses
from hsextract.extract.planning.context_fit import check_fits_context
from hsextract.extract.planning.dataset import iter_raw_rows, iter_rows, validate_row
from hsextract.extract.planning.ordering import shortest_first
from hsextract.extract.planning.plan import Plan, Planner
from hsextract.extract.planning.resume_check import check_resume
from hsextract.extract.planning.scan import DatasetScan, scan_dataset
from hsextract.extract.preflight import check_disk, check_output_dir, establish_identity, log_lengths, prepare
from hsextract.extract.progress import Progress
from hsextract.extract.requests.client import ServerClient
from hsextract.extract.requests.open_requests import OpenRequests, StallWatchdog
from hsextract.extract.requests.server_gate import ServerGate
from hsextract.extract.row_worker import RowWorker
from hsextract.extract.setup import RunSetup
from hsextract.extract.torch_threads import one_torch_thread
from hsextract.output.data_config import write_data_config
from hsextract.output.formats import format_class
from hsextract.output.formats.base import OutputFormat
from hsextract.output.identity import OutputIdentity, write_identity
from hsextract.output.manifest import Manifest, WrittenSample
from hsextract.output.sample import Sample
from hsextract.paths import make_directory
from hsextract.ports import check_metrics_port

log = logging.getLogger(__name__)

#: the dump filesystem's use is sampled at most this often while it stays under the high-water mark (two statfs
#: calls a sample: once per row, they were a tenth of the dispatching thread's calls on short rows)
SHM_SAMPLE_INTERVAL_S = 0.05


class Extraction:
    def __init__(
        self,
        config: ExtractConfig,
        metrics: ExtractMetrics | None = None,
        client: ServerClient | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or ExtractMetrics()
        self.client = client or ServerClient(
            config.server,
            config.request_timeout_s,
            rows_per_request=config.rows_per_request,
            prefill_posts=config.prefill_posts(),
        )
        self.client.observe_rows_per_post = self.metrics.rows_per_request.observe
        self.stop = stop_event or threading.Event()
        self._lock = threading.Lock()
        self._inflight = 0
        self._shm_fine_at = -math.inf  # when the dump filesystem was last sampled under the high-water mark
        self._identity: OutputIdentity | None = None
        self._gate: ServerGate | None = None
        self._finished = threading.Event()
        self._dump_lock: OutputLock | None = None  # this shard's lock in the server's dump folder, once taken
        self._interrupted_by: str | None = None  # a stop asked before the ledger exists
        self.ledger: Ledger | None = None
        self.spot: SpotChecker | None = None

    # -- stopping -----------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """End the run soon (safe from a signal handler): requests in flight are cancelled, not
        failed; the summary and data_config.json are written; a rerun resumes."""
        if self._interrupted_by is None:
            self._interrupted_by = reason
        if self.ledger is not None:
            self.ledger.request_stop(reason)
        self.stop.set()

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt

    def _watch_stop(self) -> None:
        """Once the run is stopping, cancel what is in flight (a hung server holds requests for
        request_timeout_s otherwise)."""

        def watch() -> None:
            while not self._finished.is_set():
                if self.stop.wait(0.2):
                    cancelled = self.client.cancel()
                    why = self._interrupted_by or "a fatal error"
                    log.warning(
                        "stopping (%s): cancelled the %d requests in flight; they are not failures, a rerun does "
                        "them",
                        why,
                        cancelled,
                    )
                    return

        threading.Thread(target=watch, name="hsextract-stop-watch", daemon=True).start()

    # -- setup helpers -----------------------------------------------------------------------------
    def _shard_rows(self) -> Iterator[tuple[int, object]]:
        cfg = self.config
        for row, raw in iter_raw_rows(cfg.dataset):
            if row % cfg.num_shards == cfg.shard_index:
                yield row, raw

    def _planner(self, scan: DatasetScan, manifest: Manifest, vocab_size: int) -> Planner:
        cfg = self.config
        return Planner(
            cfg.dataset,
            self._shard_rows,
            {row for row, digest in scan.row_hashes.items() if manifest.is_settled(row, digest)},
            vocab_size,
            cfg.max_seq_len,
            cfg.num_shards,
            self.stop,
            written_lengths=[s.num_tokens for s in manifest.written.values()],
            trainer_default=format_class(cfg.format).trainer_default_length,
        )

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.monotonic()
        cfg = self.config
        check_metrics_port(cfg.metrics_host, cfg.metrics_port)  # before any work; it is served after the resume check
        # the metrics port in the lock file: `hsextract status` reads this run's progress there, whatever port it is given
        lock = OutputLock(cfg.output, {"metrics_port": cfg.metrics_port or None, "metrics_host": cfg.metrics_host})
        self._watch_stop()
        try:
            check_output_dir(cfg)  # before the lock: nothing is written into a directory that is not ours
            if cfg.output.is_dir():
                lock.acquire()  # before waiting for the server: a second extractor stops at once
            setup = prepare(cfg, self.client, self.metrics, self.stop)
            make_directory(cfg.output, "output", "--output")
            lock.acquire()
            with one_torch_thread():
                return self._run_locked(started, setup)
        finally:
            self._finished.set()
            self.client.close()
            if self._dump_lock is not None:
                self._dump_lock.release()
            lock.release()

    def _run_locked(self, started: float, setup: RunSetup) -> RunSummary:
        cfg, fmt, dump_dir = self.config, setup.fmt, setup.dump_dir
        swept = sweep_temp_files(cfg.output)
        if swept:
            log.info("removed %d temporary files left by an interrupted run", swept)
        scan = scan_dataset(cfg.dataset, cfg.shard_index, cfg.num_shards, self._check_stop)
        identity = self._identity = establish_identity(setup, scan)
        setup = replace(setup, identity=identity)
        manifest = Manifest(cfg.output)
        ledger = self.ledger = Ledger(
            manifest,
            self.metrics,
            cfg.output,
            self.stop,
            max_attempts=cfg.max_attempts,
            max_consecutive_failures=cfg.max_consecutive_failures,
            server_url=cfg.server,
            max_spot_check_mismatches=cfg.spot_check_max_mismatches,
        )
        spot = self.spot = SpotChecker(cfg, self.client, self.metrics, setup.aux_layer_ids, self.stop)
        ledger.interrupted_by = self._interrupted_by
        planner: Planner | None = None
        try:
            resume = check_resume(manifest, scan, fmt, cfg.resume_check == "checksum", self._check_stop)
            resume.log_summary()
            planner = self._planner(scan, manifest, setup.vocab_size)
            plan = planner.estimate()  # the first rows only: the first request leaves within seconds
            check_disk(setup, plan, self.metrics)
            # before the sweep: it would remove another extractor's in-flight dumps
            self._dump_lock = take_dump_folder_lock(dump_dir, cfg.output, cfg.rid_prefix, cfg.shard_index, cfg.num_shards)
            stale = sweep_stale_dumps(dump_dir, cfg.rid_prefix, cfg.shard_index, cfg.num_shards)
            if stale:
                log.info("removed %d dumps of this shard left in %s by earlier requests", stale, dump_dir)
            if cfg.metrics_port:
                self.metrics.serve(cfg.metrics_port, cfg.metrics_host)
                log.info("metrics on http://%s:%d/metrics", cfg.metrics_host, cfg.metrics_port)
            self.metrics.planned.set(plan.rows_in_shard)
            self.metrics.samples.labels("resumed").inc(plan.settled)
            self.metrics.running.set(1)
            self.metrics.run_started.set(time.time())
            expect = setup.dump_expectation()
            progress = Progress(plan.rows_in_shard, plan.settled, plan.todo_tokens, cfg.log_interval_s)
            processes = cfg.pack_processes_for(plan.todo_rows)
            # forked before the plan's counter and the row threads start: a fork copies one thread only
            packer = PackProcesses(processes, fmt, cfg.output, self.metrics.pack_processes_up.set) if processes else None
            if packer is not None:
                log.info("packing in %d processes (pack_processes)", processes)
            if not plan.exact:
                planner.start(functools.partial(self._exact_plan, progress=progress))
            open_requests = OpenRequests()
            gate = self._gate = ServerGate(self.client, ledger, self.metrics, cfg.server_down_timeout_s)
            expectations = Expectations(expect, on_pin=self._pin_dtype)
            worker = RowWorker(setup, self.client, ledger, self.metrics, expectations, open_requests, gate, spot, packer)
            watchdog = StallWatchdog(open_requests, ledger, self.metrics, cfg.stall_timeout_s, down_since=gate.down_since)
            watchdog.start()
            try:
                self._stream(ledger, worker, setup, progress)
            finally:
                watchdog.close()
                worker.abandon_answers()
                if packer is not None:
                    packer.close()
                progress.close()
                self.metrics.running.set(0)
        except KeyboardInterrupt:
            self.request_stop("interrupt")
        except BaseException:
            self._close_quietly(manifest)
            raise
        status, stop_reason = ledger.outcome()
        plan = planner.result() if planner is not None else Plan(len(scan.row_hashes), 0, 0, 0)
        return self._finish(started, setup, ledger, plan, status, stop_reason)

    @staticmethod
    def _close_quietly(manifest: Manifest) -> None:
        try:
            manifest.close()
        except OSError as exc:
            log.error(
                "could not rewrite samples.jsonl and errors.jsonl sorted (%s); they stay as appended and the next run "
                "rewrites them",
                exc,
            )

    def _finish(
        self, started: float, setup: RunSetup, ledger: Ledger, plan: Plan, status: RunStatus, stop_reason: str | None
    ) -> RunSummary:
        """Write what can be written, even on a full disk: the manifest, the format's index, data_config."""
        cfg, fmt = self.config, setup.fmt
        manifest = ledger.manifest
        self._close_quietly(manifest)
        if status in (RunStatus.COMPLETE, RunStatus.INCOMPLETE):
            try:
                fmt.finalize(self._valid_samples(manifest.written, setup.vocab_size), set(manifest.written))
                removed = self._remove_unlisted(fmt, manifest)
                if removed:
                    log.info("removed %d sample files of rows this output no longer holds", removed)
            except (OSError, RuntimeError) as exc:
                if not is_disk_full(exc):
                    raise
                ledger.stop_fatal(disk_full_error(cfg.output, "the output", exc))
                status, stop_reason = ledger.outcome()
        if self._identity is not None:  # the first dump may have pinned the dtype since
            setup = replace(setup, identity=self._identity)
        spot_counts = self.spot.counts if self.spot is not None else None
        data_config = build_data_config(
            setup, manifest, plan.rows_in_shard, status, stop_reason, planned_longest=plan.longest_tokens,
            spot_checks=spot_counts,
        )  # fmt: skip
        not_written: str | None = None
        try:
            write_data_config(cfg.output, data_config)
        except OSError as exc:
            not_written = f"{exc.strerror or exc}"
            log.error("could not write %s/data_config.json (%s); the next run writes it", cfg.output, not_written)
        else:
            try:
                if trainable(data_config) and data_config.trainer is not None:
                    fmt.write_trainer_files(data_config.trainer, cfg.output, data_config.model.path)
            except OSError as exc:
                log.error("could not write the trainer's files (%s); the next run writes them", exc)
        sweep_stale_dumps(setup.dump_dir, cfg.rid_prefix, cfg.shard_index, cfg.num_shards)
        outages = self._gate.outages if self._gate is not None else 0
        return summarize(
            setup, data_config, ledger, plan, seconds=time.monotonic() - started, server_outages=outages, spot_checks=spot_counts,
            data_config_not_written=not_written,
        )

    def _exact_plan(self, plan: Plan, progress: Progress) -> None:
        self.metrics.planned.set(plan.rows_in_shard)
        self.metrics.planned_tokens.set(plan.todo_tokens)
        progress.set_totals(plan.rows_in_shard, plan.todo_tokens)
        log_lengths(self.config, plan)

    def _valid_samples(self, rows: dict[int, WrittenSample] | None, vocab_size: int) -> Iterator[Sample]:
        """The samples of ``rows``, each of which must validate; None: every row of the shard that validates."""
        cfg = self.config
        for row, raw in self._shard_rows():
            if rows is None:
                try:
                    sample = validate_row(row, raw, vocab_size, cfg.max_seq_len, cfg.require_loss_mask)
                except BadSampleError:
                    continue
                yield sample
            elif row in rows:
                yield validate_row(row, raw, vocab_size, cfg.max_seq_len, cfg.require_loss_mask)

    @staticmethod
    def _remove_unlisted(fmt: OutputFormat, manifest: Manifest) -> int:
        """Sample files of rows not written (any more): a row that left the dataset or became bad input."""
        listed = {fmt.sample_path(row) for row in manifest.written}
        removed = 0
        for path in list(fmt.sample_files()):
            if path not in listed:
                remove_quietly(path)
                removed += 1
        return removed

    def _stream(self, ledger: Ledger, worker: RowWorker, setup: RunSetup, progress: Progress) -> None:
        """Hand every row of the shard that is not settled to the workers, at most ``concurrency`` at once."""
        cfg, vocab_size, dump_dir = self.config, setup.vocab_size, setup.dump_dir
        manifest = ledger.manifest
        slots = threading.BoundedSemaphore(cfg.concurrency)
        digests: dict[int, str] = {}  # each row's content hash, as read now; taken when the row leaves

        def shard_rows() -> Iterator[tuple[int, object]]:
            for item in iter_rows(cfg.dataset):
                if item.row % cfg.num_shards == cfg.shard_index:
                    digests[item.row] = item.digest
                    yield item.row, item.raw

        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="hsextract-req") as pool:
            try:
                for row, raw in shortest_first(shard_rows(), cfg.sort_window):
                    digest = digests.pop(row)
                    if self.stop.is_set():
                        break
                    if manifest.is_settled(row, digest):
                        continue
                    try:
                        sample = validate_row(row, raw, vocab_size, cfg.max_seq_len, cfg.require_loss_mask)
                        check_fits_context(sample, setup.server.context_length, cfg.max_seq_len)
                    except BadSampleError as exc:
                        ledger.bad_input(row, digest, exc)
                        progress.advance()
                        continue
                    if not self._wait_for_shm(ledger, dump_dir):
                        break
                    while not slots.acquire(timeout=0.5):
                        if self.stop.is_set():
                            break
                    if self.stop.is_set():
                        break
                    with self._lock:
                        self._inflight += 1
                    self.metrics.inflight.inc()
                    future: Future[None] = pool.submit(worker.process, sample, digest)
                    future.add_done_callback(
                        functools.partial(self._on_done, ledger=ledger, sample=sample, slots=slots, progress=progress)
                    )
                    if not ledger.fanned_out.is_set():
                        self._await_probe(future)
                if not self.stop.is_set():
                    setup.fmt.prepare_finalize(functools.partial(self._valid_samples, None, vocab_size))
            except BaseException:
                self.stop.set()
                raise

    def _await_probe(self, future: Future[None]) -> None:
        """Until one sample is written, each request goes alone: a wrong server (403, HTML) or a
        wrong setup stops the run after one request, not after ``concurrency`` of them."""
        while not self.stop.is_set():
            done, _ = concurrent.futures.wait([future], timeout=0.2)
            if done:
                return

    def _on_done(
        self,
        future: Future[None],
        *,
        ledger: Ledger,
        sample: Sample,
        slots: threading.BoundedSemaphore,
        progress: Progress,
    ) -> None:
        self.metrics.inflight.dec()
        with self._lock:
            self._inflight -= 1
        slots.release()
        exc = future.exception()
        if exc is not None:
            if not isinstance(exc, HsextractError) and is_disk_full(exc):
                # a local write the worker did not expect to fail (ENOSPC): the output's disk, not the server
                ledger.stop_fatal(disk_full_error(self.config.output, "the output", exc))
                return
            # a bug, not a sample problem: stop the run loudly
            log.error("row %d crashed the worker: %r", sample.row, exc)
            ledger.stop_fatal(
                exc if isinstance(exc, HsextractError) else ServerError(f"internal error on row {sample.row}: {exc!r}")
            )
            return
        progress.advance(len(sample.input_ids))

    def _wait_for_shm(self, ledger: Ledger, dump_dir: Path) -> bool:
        """Wait while the dump filesystem is above the high-water mark; False when the run stops."""
        cfg = self.config
        full_since: float | None = None
        while not self.stop.is_set():
            now = time.monotonic()
            if now - self._shm_fine_at < SHM_SAMPLE_INTERVAL_S:
                return True
            used = self.metrics.sample_filesystems(dump_dir, cfg.output)
            if used is None or used < cfg.shm_high_water:
                self._shm_fine_at = now
                return True
            if full_since is None:
                log.warning("dump filesystem %s is %.0f%% full; waiting for it to drain", dump_dir, used * 100)
                full_since = now
            with self._lock:
                busy = self._inflight > 0
            if busy:
                full_since = now  # our own dumps fill it: they drain as they are packed
            elif now - full_since >= cfg.shm_wait_timeout_s:
                ledger.stop_fatal(
                    DiskFullError(
                        f"the dump filesystem of {dump_dir} has stayed {used:.0%} full (shm_high_water "
                        f"{cfg.shm_high_water:.0%}) for {cfg.shm_wait_timeout_s:.0f} s with no request of this run in "
                        f"flight: something else fills it. Free space there (df -h {dump_dir}; docs/runbooks/shm-full.md), "
                        "then rerun the same command to resume"
                    )
                )
                return False
            self.stop.wait(0.2)
        return False

    def _pin_dtype(self, computed: str) -> str | None:
        """A server that does not report its dtype: the first dump's sets it for the whole output."""
        with self._lock:
            identity = self._identity
            if identity is not None and identity.dtype is None:
                identity = self._identity = replace(identity, dtype=computed, stored_dtype=identity.stored_dtype or computed)
                write_identity(self.config.output, identity)
            return identity.dtype if identity is not None else None
