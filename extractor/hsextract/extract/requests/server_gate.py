"""Mid-run outages: a server that stops taking connections is waited for, not failed against.

A server that is restarted (systemd after a crash, ``make restart``, a SIGKILL and the launcher)
refuses connections for as long as it loads: a few seconds for a tiny model, 15-25 minutes for a
Kimi-size one. Spending each row's tries against it would record every row in flight as failed and
stop the run on the breaker within seconds. Instead the first worker that finds the server
unreachable waits for its ``/health_generate`` on behalf of all of them (up to
``server_down_timeout_s``); the others wait for that outcome, and every row then goes on with the
try it was on. A server that stays away stops the run with a clear error; its rows are not
recorded, so a rerun does them.
"""

from __future__ import annotations

import logging
import threading
import time

from hsextract.errors import ServerError
from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.requests.client import ServerClient

log = logging.getLogger(__name__)


class _Outage:
    def __init__(self) -> None:
        self.began = time.monotonic()
        self.over = threading.Event()
        self.back = False


class ServerGate:
    """One wait per outage, shared by every worker thread of a run."""

    def __init__(self, client: ServerClient, ledger: Ledger, metrics: ExtractMetrics, timeout_s: float) -> None:
        self.client = client
        self.ledger = ledger
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._outage: _Outage | None = None
        self.outages = 0  # for the run summary

    def down_since(self) -> float | None:
        """When (``time.monotonic``) the outage now being waited through began; None while the server is up."""
        with self._lock:
            return None if self._outage is None else self._outage.began

    def wait_until_back(self, cause: Exception) -> bool:
        """Block until the server answers again; False when the run stops instead (the server stayed
        away for ``timeout_s``, or the run is stopping for another reason)."""
        with self._lock:
            outage = self._outage
            leading = outage is None
            if outage is None:
                outage = self._outage = _Outage()
        if leading:
            self._wait(outage, cause)
            with self._lock:
                self._outage = None
            outage.over.set()
        else:
            while not outage.over.wait(0.5):
                if self.ledger.stop.is_set():
                    return False
        return outage.back and not self.ledger.stop.is_set()

    def _wait(self, outage: _Outage, cause: Exception) -> None:
        self.outages += 1
        self.metrics.server_up.set(0)
        self.metrics.server_outages.inc()
        log.warning(
            "the server stopped taking connections (%s); requests are paused until it answers %s/health_generate "
            "again, for up to %.0f s (--server-down-timeout-s); no row is failed meanwhile",
            cause,
            self.client.base_url,
            self.timeout_s,
        )
        try:
            self.client.wait_until_healthy(self.timeout_s, self.ledger.stop)
        except KeyboardInterrupt:  # the run is stopping: not the server's fault
            return
        except ServerError as exc:
            self.ledger.stop_fatal(
                ServerError(
                    f"the server stopped taking connections mid-run and did not come back within {self.timeout_s:.0f} s "
                    f"(--server-down-timeout-s): {exc}. No row was failed for it: start the server "
                    "(docs/runbooks/restart-server.md), then rerun the same command to resume"
                )
            )
            return
        outage.back = True
        self.metrics.server_up.set(1)
        log.info("the server is back after %.0f s; requests go on", time.monotonic() - outage.began)
