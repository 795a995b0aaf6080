"""Prometheus metrics of an extraction run (prefix ``hsextract_``; the list is in the README, "Metrics")."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hsextract.contract.states import ErrorReason
from hsextract.ports import serve_metrics

#: the ``status`` label values of ``hsextract_samples_total``
SAMPLE_STATUSES = ("ok", "bad_input", "failed", "resumed")

#: per-sample stages of the extractor, in order (spot_check: only the rows checked, which take no turn)
STAGES = ("request", "wait_dump", "turn", "read", "verify", "spot_check", "pack", "sync")

#: the ``result`` label values of ``hsextract_spot_checks_total``
SPOT_CHECK_RESULTS = ("match", "mismatch", "error")


class ExtractMetrics:
    """All metrics on one registry (pass a fresh one in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.samples = Counter(
            "hsextract_samples", "Samples settled, by status (ok, bad_input, failed, resumed)", ["status"], registry=r
        )
        self.tokens = Counter("hsextract_tokens", "Tokens written to the output", registry=r)
        self.truncated = Counter("hsextract_truncated_samples", "Samples truncated to max_seq_len", registry=r)
        self.without_loss_mask = Counter(
            "hsextract_samples_without_loss_mask",
            "Samples written from rows without loss_mask (every token supervised, prompts included)",
            registry=r,
        )
        self.errors = Counter("hsextract_errors", "Errors by reason (bad input, dump checks, server)", ["reason"], registry=r)
        self.retries = Counter("hsextract_retries", "Requests retried", registry=r)
        self.shm_used = Gauge("hsextract_shm_used_bytes", "Bytes used on the dump filesystem", registry=r)
        self.shm_total = Gauge("hsextract_shm_total_bytes", "Size of the dump filesystem", registry=r)
        self.disk_free = Gauge("hsextract_disk_free_bytes", "Free bytes on the output filesystem", registry=r)
        self.output_bytes = Counter("hsextract_output_bytes", "Bytes written to the output", registry=r)
        self.inflight = Gauge(
            "hsextract_inflight_requests", "Rows sent and not yet packed (up to rows_per_request share a request)", registry=r
        )
        self.request_seconds = Histogram(
            "hsextract_request_seconds",
            "Seconds from sending a request to its dump being packed",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.rows_per_request = Histogram(
            "hsextract_rows_per_request",
            "Rows each answered /generate carried (rows_per_request at most: the rows waiting to be sent go together)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.packed_in_process = Counter(
            "hsextract_packed_in_process",
            "Samples read, checked and written in a pack process (pack_processes); the rest on their request threads",
            registry=r,
        )
        self.pack_processes_up = Gauge(
            "hsextract_pack_processes_up",
            "Pack processes ready for rows (pack_processes): forks of the run's process, up within milliseconds; one "
            "started in place of one that died imports torch (seconds), and rows are packed on their own threads meanwhile",
            registry=r,
        )
        self.stage_seconds = Histogram(
            "hsextract_stage_seconds",
            "Seconds per sample in each extractor stage: request (until the server answered or the dump was complete), "
            "wait_dump (after the answer, until its dump was complete; 0 when the dump came first), turn (a row's "
            "wait for its turn to be packed), read (the dump), "
            "verify (check it), spot_check (ask the engine for its own states of the row and compare them; checked rows "
            "only), pack (write the output file; the speculators format checks the values for NaN and infinity as it "
            "writes them, not in verify), sync (wait for the file to reach the disk before its record is kept)",
            ["stage"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.planned = Gauge("hsextract_samples_planned", "Rows this run is responsible for (its shard)", registry=r)
        self.planned_tokens = Gauge("hsextract_tokens_planned", "Tokens this run will write in all", registry=r)
        self.server_up = Gauge("hsextract_server_up", "1 when the server answered its last request or health check", registry=r)
        self.running = Gauge("hsextract_running", "1 while the extraction runs, 0 once it has finished", registry=r)
        self.run_started = Gauge(
            "hsextract_run_start_time_seconds",
            "Unix time the current extraction run started (alerts stay quiet at first)",
            registry=r,
        )
        self.oldest_open = Gauge(
            "hsextract_oldest_open_request_seconds",
            "Age of the oldest row whose request is open and not yet settled (0 when none is open)",
            registry=r,
        )
        self.late_answers = Counter(
            "hsextract_late_answers",
            "Rows settled by their complete, checked dump before the server's HTTP answer arrived",
            registry=r,
        )
        self.dump_pickup_seconds = Histogram(
            "hsextract_dump_pickup_seconds",
            "Seconds from a dump being complete (its done marker) to the extractor taking it up",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.resends = Counter(
            "hsextract_watchdog_resends",
            "Requests the stall watchdog sent again because the server had no trace of them",
            registry=r,
        )
        self.server_outages = Counter(
            "hsextract_server_outages",
            "Times the server stopped taking connections mid-run and the run waited for it to come back",
            registry=r,
        )
        self.spot_checks = Counter(
            "hsextract_spot_checks",
            "Rows checked against the engine's own hidden states (return_hidden_states), by result: match, mismatch "
            "(the row is in errors.jsonl), error (the check request failed; the row went on unchecked)",
            ["result"],
            registry=r,
        )
        self.spot_check_every = Gauge(
            "hsextract_spot_check_every", "The run checks every Nth row against the engine (0: spot check off)", registry=r
        )
        # Every series exists from the start at 0: panels and rate() show 0, not "no data".
        for status in SAMPLE_STATUSES:
            self.samples.labels(status)
        for reason in ErrorReason:
            self.errors.labels(reason.value)
        for result in SPOT_CHECK_RESULTS:
            self.spot_checks.labels(result)
        for stage in STAGES:
            self.stage_seconds.labels(stage)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time one stage of one sample into ``hsextract_stage_seconds{stage=name}``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(name).observe(time.perf_counter() - started)

    def stage_totals(self) -> dict[str, float]:
        """Summed seconds per stage so far (over all worker threads)."""
        totals = dict.fromkeys(STAGES, 0.0)
        for metric in self.stage_seconds.collect():
            for sample in metric.samples:
                if sample.name.endswith("_sum"):
                    totals[sample.labels["stage"]] = sample.value
        return totals

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve /metrics; a port another process holds is a ConfigError naming it (checked first: ports.py)."""
        serve_metrics(lambda: start_http_server(port, addr=host, registry=self.registry), host, port)

    def sample_filesystems(self, dump_dir: Path | None, output_dir: Path) -> float | None:
        """Update the shm and disk gauges; return the dump filesystem's used fraction."""
        self.disk_free.set(shutil.disk_usage(output_dir).free)
        if dump_dir is None or not dump_dir.exists():
            return None
        usage = shutil.disk_usage(dump_dir)
        self.shm_used.set(usage.used)
        self.shm_total.set(usage.total)
        return usage.used / usage.total if usage.total else None
