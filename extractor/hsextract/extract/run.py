"""The extraction run: plan, stream requests, verify and pack dumps, record everything.

One instance runs one shard of one dataset into one output directory. Rerunning the same
command resumes: rows already written or known to be bad input are skipped, everything else is
(re)done, and the output ends up identical to an uninterrupted run's.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hsextract.config import ExtractConfig
from hsextract.contract.atomic import is_temp_name
from hsextract.contract.dumps import Dump, dump_state, read_dump, read_error, remove_dump
from hsextract.contract.layers import capture_indices, resolve_aux_layer_ids
from hsextract.contract.model_config import read_model_config
from hsextract.contract.rids import make_rid
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.sglang_capture import ModelFamily, family_of
from hsextract.contract.states import DumpState, ErrorKind, RunStatus
from hsextract.errors import (
    BadSampleError,
    ConfigError,
    DiskSpaceError,
    DumpError,
    HsextractError,
    LayerMismatchError,
    ServerError,
    TransientServerError,
)
from hsextract.extract.client import ServerClient
from hsextract.extract.data_config import build_data_config, read_data_config, write_data_config
from hsextract.extract.dataset import Sample, dataset_kind, iter_raw_rows, validate_row
from hsextract.extract.dump_checks import DumpExpectation, check_dump
from hsextract.extract.formats import OutputFormat, open_format
from hsextract.extract.manifest import ErrorRecord, Manifest, WrittenSample
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.ordering import shortest_first
from hsextract.extract.plan import Plan, Planner
from hsextract.extract.progress import Progress
from hsextract.extract.serving_hints import (
    SPECFORGE_NUM_AUX_LAYERS,
    TRAINER_DEFAULT_LENGTH,
    TRAINER_LENGTH_SETTING,
    SGLangServing,
    sglang_serving,
    summary_lines,
)

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class RunSummary:
    status: RunStatus
    output: Path
    rows_in_shard: int
    written_now: int
    resumed: int
    bad_input: int
    failed: int
    truncated: int
    total_samples: int
    total_tokens: int
    seconds: float
    fatal_error: str | None = None
    #: how to serve and train on the output (data_config.json ``serving`` and ``trainer``)
    hints: tuple[str, ...] = ()


def sweep_temp_files(root: Path) -> int:
    """Remove temp files a killed run left behind; they are never under a final name."""
    removed = 0
    for path in root.rglob(".*.tmp-*"):
        if is_temp_name(path.name):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
    return removed


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
        self.client = client or ServerClient(config.server, config.request_timeout_s)
        self.stop = stop_event or threading.Event()
        self._lock = threading.Lock()
        self._consecutive_failures = 0
        self._fatal: HsextractError | None = None
        self._written_now = 0
        self._failed_now = 0
        self._pinned_dtype: str | None = None
        self._final_prenorm = False  # ask the server for the pre-norm state (only when the format needs it)

    # -- setup (nothing is written before all of it passes) -----------------------------------------
    def _preflight(self) -> tuple[ServerInfo, list[int], Path, OutputFormat]:
        cfg = self.config
        dataset_kind(cfg.dataset)  # raises DatasetError with the fix
        if cfg.output.exists() and not cfg.output.is_dir():
            raise ConfigError(f"output {cfg.output} exists and is not a directory; choose another --output")
        self.client.wait_until_healthy(cfg.health_timeout_s)
        self.metrics.server_up.set(1)
        identity = self.client.server_info(cfg.vocab_size)
        if cfg.expect_model and not identity.model_path.rstrip("/").endswith(cfg.expect_model.rstrip("/")):
            raise ConfigError(
                f"the server serves {identity.model_path!r}, not the expected model {cfg.expect_model!r}; "
                "restart the server with the right model or fix expect_model"
            )
        aux = resolve_aux_layer_ids(cfg.layer_ids or identity.layer_ids, identity.num_layers)
        if identity.layer_ids is not None and list(identity.layer_ids) != aux:
            raise ConfigError(
                f"layer_ids {aux} are configured but the server captures {identity.layer_ids}; "
                "restart the server with the same layers or drop layer_ids from the extractor config"
            )
        dump_dir = cfg.dump_dir or (Path(identity.dump_dir) if identity.dump_dir else None)
        if dump_dir is None:
            raise ConfigError("the server does not say where it dumps; set dump_dir (--dump-dir) to its dump root")
        fmt = open_format(cfg.format, cfg.output)
        if fmt.needs_final_prenorm and identity.provides_final_prenorm is False:
            raise ConfigError(
                f"format {cfg.format} needs the pre-norm final state, which this server does not dump; "
                "use --format specforge or enable the pre-norm dump in the server's hook config"
            )
        previous = read_data_config(cfg.output)
        if previous is not None:
            for key, now in (
                ("format", cfg.format),
                ("aux_layer_ids", aux),
                ("hidden_size", identity.hidden_size),
                ("max_seq_len", cfg.max_seq_len),
                *((("dtype", fmt.stored_dtype),) if fmt.stored_dtype else ()),
            ):
                if previous.get(key) != now:
                    raise ConfigError(
                        f"output {cfg.output} already holds a run with {key}={previous.get(key)!r}, this run has "
                        f"{now!r}; use a new --output instead of mixing the two"
                    )
        return identity, aux, dump_dir, fmt

    def _serving_and_trainer_guards(self, identity: ServerInfo, aux: list[int], fmt: OutputFormat) -> SGLangServing:
        """Refuse what the trainer or SGLang would fail on later; the SGLang value for these layers."""
        cfg = self.config
        if fmt.name == "specforge" and len(aux) != SPECFORGE_NUM_AUX_LAYERS:
            raise ConfigError(
                f"format specforge with {len(aux)} aux layers {aux}: SpecForge's EAGLE-3 draft takes exactly "
                f"{SPECFORGE_NUM_AUX_LAYERS} (it refuses any other count at its first step); set three layer_ids or use "
                "--format speculators"
            )
        if cfg.architecture != "auto":
            family: ModelFamily | None = ModelFamily(cfg.architecture)
        else:
            family = family_of(read_model_config(identity.model_path)) if identity.model_path else None
            if family is None:
                log.warning(
                    "the model family of %r is unknown here: data_config.json will carry no SGLang draft-config value; "
                    "set architecture (--architecture deepseek|llama|qwen2) to get it",
                    identity.model_path,
                )
        serving = sglang_serving(family, aux, identity.num_layers)  # ConfigError when SGLang cannot serve them
        computed = identity.dtype
        if fmt.stored_dtype is not None and computed is not None and computed != fmt.stored_dtype:
            log.info(
                "the server computes %s states; format %s stores them as %s (its trainer runs in %s), recorded in "
                "data_config.json",
                computed,
                fmt.name,
                fmt.stored_dtype,
                fmt.stored_dtype,
            )
        return serving

    def _shard_rows(self) -> Iterator[tuple[int, object]]:
        cfg = self.config
        for row, raw in iter_raw_rows(cfg.dataset):
            if row % cfg.num_shards == cfg.shard_index:
                yield row, raw

    def _check_disk(self, plan: Plan, identity: ServerInfo, num_aux: int, fmt: OutputFormat) -> None:
        stored = fmt.stored_dtype or identity.dtype or "bfloat16"
        per_token = (num_aux + 1) * identity.hidden_size * _DTYPE_BYTES.get(stored, 2) + 16
        needed = int(plan.todo_tokens * per_token * self.config.disk_headroom)
        free = shutil.disk_usage(self.config.output).free
        self.metrics.planned_tokens.set(plan.todo_tokens)
        log.info(
            "plan%s: %d rows in this shard, %d already settled, %d to extract (%d tokens x %d bytes as %s: about %.2f GB; "
            "%.2f GB free)",
            "" if plan.exact else " (estimated from the first rows; counted exactly while the run goes)",
            plan.rows_in_shard,
            plan.settled,
            plan.todo_rows,
            plan.todo_tokens,
            per_token,
            stored,
            needed / 1e9,
            free / 1e9,
        )
        if plan.exact:
            self._log_lengths(plan)
        if needed > free:
            raise DiskSpaceError(
                f"output {self.config.output} has {free / 1e9:.2f} GB free but this run needs about {needed / 1e9:.2f} GB "
                f"({plan.todo_tokens} tokens x {per_token} bytes x {self.config.disk_headroom}); free space or choose "
                "another --output"
            )

    def _log_lengths(self, plan: Plan) -> None:
        cfg = self.config
        log.info(
            "plan: %d of them longer than max_seq_len %d (truncated and counted); the longest sample will have %d tokens",
            plan.truncated_rows,
            cfg.max_seq_len,
            plan.longest_tokens,
        )
        if plan.over_trainer_default:
            log.warning(
                "plan: %d samples are longer than %s's default %s %d and would lose their tail there: train with %s %d "
                "(recorded in data_config.json)",
                plan.over_trainer_default,
                cfg.format,
                TRAINER_LENGTH_SETTING[cfg.format],
                TRAINER_DEFAULT_LENGTH[cfg.format],
                TRAINER_LENGTH_SETTING[cfg.format],
                plan.longest_tokens,
            )

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.monotonic()
        cfg = self.config
        identity, aux, dump_dir, fmt = self._preflight()
        serving = self._serving_and_trainer_guards(identity, aux, fmt)
        cfg.output.mkdir(parents=True, exist_ok=True)
        swept = sweep_temp_files(cfg.output)
        if swept:
            log.info("removed %d temporary files left by an interrupted run", swept)
        manifest = Manifest(cfg.output)
        planner = Planner(
            cfg.dataset,
            self._shard_rows,
            set(manifest.written) | set(manifest.errors),
            identity.vocab_size,
            cfg.max_seq_len,
            cfg.num_shards,
            self.stop,
            written_lengths=[s.num_tokens for s in manifest.written.values()],
            trainer_default=TRAINER_DEFAULT_LENGTH[cfg.format],
        )
        plan = planner.estimate()  # the first rows only: the first request leaves within seconds
        self._check_disk(plan, identity, len(aux), fmt)
        if cfg.metrics_port:
            self.metrics.serve(cfg.metrics_port, cfg.metrics_host)
            log.info("metrics on http://%s:%d/metrics", cfg.metrics_host, cfg.metrics_port)
        self.metrics.planned.set(plan.rows_in_shard)
        self.metrics.samples.labels("resumed").inc(plan.settled)
        self.metrics.running.set(1)
        expect = DumpExpectation(aux, capture_indices(aux), identity.hidden_size, identity.dtype, fmt.needs_final_prenorm)
        self._pinned_dtype = identity.dtype
        progress = Progress(plan.rows_in_shard, plan.settled, plan.todo_tokens, cfg.log_interval_s)
        if not plan.exact:
            planner.start(functools.partial(self._exact_plan, progress=progress))
        self._final_prenorm = fmt.needs_final_prenorm and bool(identity.final_prenorm_per_request)
        status = RunStatus.COMPLETE
        try:
            self._stream(manifest, identity, fmt, dump_dir, expect, progress)
        except KeyboardInterrupt:
            self.stop.set()
            status = RunStatus.INTERRUPTED
            log.warning("interrupted: stopping after the requests in flight; rerun the same command to resume")
        finally:
            progress.close()
            self.metrics.running.set(0)
        if self._fatal is not None:
            status = RunStatus.STOPPED
        elif status is RunStatus.COMPLETE and self._failed_now:
            status = RunStatus.INCOMPLETE
        manifest.close()
        plan = planner.result()
        if status in (RunStatus.COMPLETE, RunStatus.INCOMPLETE):
            fmt.finalize(self._valid_samples(manifest.written, identity.vocab_size), set(manifest.written))
        data_config = build_data_config(
            cfg, identity, aux, fmt, manifest, plan.rows_in_shard, status, serving, identity.dtype or self._pinned_dtype
        )
        write_data_config(cfg.output, data_config)
        self.client.close()
        summary = RunSummary(
            status=status,
            output=cfg.output,
            rows_in_shard=plan.rows_in_shard,
            written_now=self._written_now,
            resumed=plan.settled,
            bad_input=sum(1 for e in manifest.errors.values() if e.kind is ErrorKind.BAD_INPUT),
            failed=sum(1 for e in manifest.errors.values() if e.kind is ErrorKind.FAILED),
            truncated=data_config["truncated_samples"],
            total_samples=data_config["total_samples"],
            total_tokens=data_config["total_tokens"],
            seconds=time.monotonic() - started,
            fatal_error=None if self._fatal is None else f"{type(self._fatal).__name__}: {self._fatal}",
            hints=tuple(summary_lines(serving, data_config["trainer"], cfg.output)),
        )
        return summary

    def _exact_plan(self, plan: Plan, progress: Progress) -> None:
        self.metrics.planned.set(plan.rows_in_shard)
        self.metrics.planned_tokens.set(plan.todo_tokens)
        progress.set_totals(plan.rows_in_shard, plan.todo_tokens)
        self._log_lengths(plan)

    def _valid_samples(self, rows: dict[int, WrittenSample], vocab_size: int) -> Iterator[Sample]:
        for row, raw in self._shard_rows():
            if row in rows:
                yield validate_row(row, raw, vocab_size, self.config.max_seq_len)

    def _stream(
        self,
        manifest: Manifest,
        identity: ServerInfo,
        fmt: OutputFormat,
        dump_dir: Path,
        expect: DumpExpectation,
        progress: Progress,
    ) -> None:
        cfg = self.config
        slots = threading.BoundedSemaphore(cfg.concurrency)
        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="hsextract-req") as pool:
            try:
                for row, raw in shortest_first(self._shard_rows(), cfg.sort_window):
                    if self.stop.is_set():
                        break
                    if manifest.is_settled(row):
                        continue
                    try:
                        sample = validate_row(row, raw, identity.vocab_size, cfg.max_seq_len)
                    except BadSampleError as exc:
                        self._record_bad(manifest, row, exc)
                        progress.advance()
                        continue
                    self._wait_for_shm(dump_dir)
                    while not slots.acquire(timeout=0.5):
                        if self.stop.is_set():
                            break
                    if self.stop.is_set():
                        break
                    self.metrics.inflight.inc()
                    future: Future[None] = pool.submit(self._process, sample, manifest, fmt, dump_dir, expect)
                    future.add_done_callback(functools.partial(self._finished, sample=sample, slots=slots, progress=progress))
            except BaseException:
                self.stop.set()
                raise

    def _finished(self, future: Future[None], *, sample: Sample, slots: threading.BoundedSemaphore, progress: Progress) -> None:
        self.metrics.inflight.dec()
        slots.release()
        if future.exception() is not None:  # a bug, not a sample problem: stop the run loudly
            with self._lock:
                exc = future.exception()
                self._fatal = (
                    exc if isinstance(exc, HsextractError) else ServerError(f"internal error on row {sample.row}: {exc!r}")
                )
            log.error("row %d crashed the worker: %r", sample.row, future.exception())
            self.stop.set()
            return
        progress.advance(len(sample.input_ids))

    def _wait_for_shm(self, dump_dir: Path) -> None:
        warned = False
        while not self.stop.is_set():
            used = self.metrics.sample_filesystems(dump_dir, self.config.output)
            if used is None or used < self.config.shm_high_water:
                return
            if not warned:
                log.warning("dump filesystem %s is %.0f%% full; waiting for it to drain", dump_dir, used * 100)
                warned = True
            self.stop.wait(0.2)

    # -- one sample ---------------------------------------------------------------------------------
    def _process(self, sample: Sample, manifest: Manifest, fmt: OutputFormat, dump_dir: Path, expect: DumpExpectation) -> None:
        cfg = self.config
        rid = make_rid(sample.row, len(sample.input_ids), cfg.rid_prefix)
        directory = dump_dir / rid
        last_error: Exception | None = None
        for attempt in range(1, cfg.max_attempts + 1):
            if self.stop.is_set():
                return  # abandoned: not recorded, so the next run does it
            remove_dump(directory)
            started = time.monotonic()
            try:
                with self.metrics.stage("request"):
                    self.client.prefill(rid, sample.input_ids, final_prenorm=self._final_prenorm)
                self.metrics.server_up.set(1)
                with self.metrics.stage("wait_dump"):
                    dump = self._wait_for_dump(directory)
                with self.metrics.stage("verify"):
                    check_dump(dump, sample.input_ids, self._expectation(expect, dump))
                with self.metrics.stage("pack"):
                    size = fmt.write_sample(sample, dump)
            except BadSampleError as exc:
                remove_dump(directory)
                self._record_bad(manifest, sample.row, exc)
                return
            except LayerMismatchError as exc:
                self._stop_fatal(exc)
                return
            except TransientServerError as exc:
                self.metrics.server_up.set(0 if not self.client.healthy() else 1)
                self.metrics.errors.labels("server").inc()
                last_error = exc
            except DumpError as exc:
                if self.stop.is_set():
                    return  # interrupted while waiting: not a failure, the next run redoes the row
                self.metrics.errors.labels(exc.reason).inc()
                last_error = exc
            else:
                remove_dump(directory)
                self._record_written(manifest, fmt, sample, size, time.monotonic() - started)
                return
            log.warning("row %d attempt %d/%d failed: %s", sample.row, attempt, cfg.max_attempts, last_error)
            if attempt < cfg.max_attempts:
                self.metrics.retries.inc()
                self.stop.wait(min(30.0, 0.5 * 2**attempt))
        remove_dump(directory)
        if self.stop.is_set():
            return
        self._record_failed(manifest, sample.row, last_error)

    def _expectation(self, expect: DumpExpectation, dump: Dump) -> DumpExpectation:
        # A server that does not report its dtype: the first dump sets it for the whole run.
        if expect.dtype is None:
            with self._lock:
                if self._pinned_dtype is None:
                    self._pinned_dtype = str(dump.final_hidden_state.dtype).removeprefix("torch.")
                return DumpExpectation(
                    expect.aux_layer_ids,
                    expect.capture_indices,
                    expect.hidden_size,
                    self._pinned_dtype,
                    expect.need_final_prenorm,
                )
        return expect

    def _wait_for_dump(self, directory: Path) -> Dump:
        # The SGLang hook writes on a background thread: the dump can land after the response.
        deadline = time.monotonic() + self.config.dump_timeout_s
        delay = 0.002
        while True:
            state = dump_state(directory)
            if state is DumpState.DONE:
                return read_dump(directory)
            if state is DumpState.ERROR:
                raise DumpError("server_dump_error", f"the server could not dump {directory.name}: {read_error(directory)}")
            if time.monotonic() > deadline:
                raise DumpError(
                    "dump_timeout",
                    f"no dump appeared at {directory} within {self.config.dump_timeout_s:.0f} s after the request "
                    "returned; is dump_dir the directory the server writes to (same host, same /dev/shm)?",
                )
            if self.stop.wait(delay):
                raise DumpError("interrupted", "run stopping")
            delay = min(delay * 2, 0.05)

    # -- bookkeeping -------------------------------------------------------------------------------
    def _record_written(self, manifest: Manifest, fmt: OutputFormat, sample: Sample, size: int, seconds: float) -> None:
        manifest.add_written(
            WrittenSample(sample.row, fmt.relative(sample.row), len(sample.input_ids), sample.original_length, size)
        )
        with self._lock:
            self._consecutive_failures = 0
            self._written_now += 1
        self.metrics.samples.labels("ok").inc()
        self.metrics.tokens.inc(len(sample.input_ids))
        self.metrics.output_bytes.inc(size)
        self.metrics.request_seconds.observe(seconds)
        if sample.truncated:
            self.metrics.truncated.inc()

    def _record_bad(self, manifest: Manifest, row: int, exc: BadSampleError) -> None:
        log.warning("skipping bad row %d: %s", row, exc)
        manifest.add_error(ErrorRecord(row, ErrorKind.BAD_INPUT, exc.reason, str(exc)))
        self.metrics.samples.labels("bad_input").inc()
        self.metrics.errors.labels(exc.reason).inc()

    def _record_failed(self, manifest: Manifest, row: int, error: Exception | None) -> None:
        reason = getattr(error, "reason", "server")
        manifest.add_error(ErrorRecord(row, ErrorKind.FAILED, reason, str(error)))
        self.metrics.samples.labels("failed").inc()
        with self._lock:
            self._failed_now += 1
            self._consecutive_failures += 1
            failures = self._consecutive_failures
        if failures >= self.config.max_consecutive_failures:
            self._stop_fatal(
                ServerError(
                    f"{failures} samples in a row failed after {self.config.max_attempts} tries each; last error: {error}. "
                    f"Check the server (curl {self.config.server}/health_generate, its log) and that the dump dir is shared "
                    "with it; then rerun the same command to resume"
                )
            )

    def _stop_fatal(self, error: HsextractError) -> None:
        with self._lock:
            if self._fatal is None:
                self._fatal = error
        log.error("stopping the run: %s", error)
        self.stop.set()
