"""Prometheus metrics of a regeneration run (prefix ``hsextract_regen_``; README "Metrics", dashboard row
"Regeneration", runbook ``docs/runbooks/regeneration.md``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hsextract.ports import serve_metrics
from hsextract.prepare.conversation import Reason
from hsextract.regen.client import SERVER_ERROR, SERVER_REFUSED
from hsextract.regen.conversation import NO_ASSISTANT_TURN, TRUNCATED

#: the ``status`` label values of ``hsextract_regen_rows_total``
ROW_STATUSES = ("ok", "failed", "skipped", "resumed")
#: the ``finish_reason`` label values of ``hsextract_regen_turns_total``
FINISH_REASONS = ("stop", "length")
#: every ``reason`` a row can fail or be skipped for, so ``hsextract_regen_errors_total`` has each series (0) from the start
ERROR_REASONS = (
    *(value for name, value in vars(Reason).items() if name.isupper()),
    NO_ASSISTANT_TURN,
    TRUNCATED,
    SERVER_REFUSED,
    SERVER_ERROR,
)


class RegenMetrics:
    """All metrics on one registry (pass a fresh one in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rows = Counter(
            "hsextract_regen_rows", "Rows settled, by status (ok, failed, skipped, resumed)", ["status"], registry=r
        )
        self.turns = Counter(
            "hsextract_regen_turns", "Assistant turns regenerated, by finish reason (stop, length)", ["finish_reason"],
            registry=r,
        )
        self.generated_tokens = Counter("hsextract_regen_generated_tokens", "Tokens the server generated", registry=r)
        self.prompt_tokens = Counter("hsextract_regen_prompt_tokens", "Prompt tokens sent", registry=r)
        self.errors = Counter("hsextract_regen_errors", "Rows failed or skipped, by reason", ["reason"], registry=r)
        self.retries = Counter("hsextract_regen_retries", "Requests retried after a transient server error", registry=r)
        self.inflight = Gauge("hsextract_regen_inflight_requests", "/generate requests sent and not yet answered", registry=r)
        self.planned = Gauge("hsextract_regen_rows_planned", "Input rows of this run", registry=r)
        self.running = Gauge("hsextract_regen_running", "1 while a regeneration runs, 0 once it has finished", registry=r)
        self.server_up = Gauge("hsextract_regen_server_up", "1 when the server answered the last request", registry=r)
        self.run_started = Gauge(
            "hsextract_regen_run_start_time_seconds",
            "Unix time the current regeneration run started (alerts stay quiet at first)",
            registry=r,
        )
        self.request_seconds = Histogram(
            "hsextract_regen_request_seconds",
            "Seconds of one /generate request (one assistant turn)",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        for status in ROW_STATUSES:
            self.rows.labels(status)
        for reason in FINISH_REASONS:
            self.turns.labels(reason)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve /metrics; a port another process holds is a ConfigError naming it (checked first: ports.py)."""
        serve_metrics(lambda: start_http_server(port, addr=host, registry=self.registry), host, port)
