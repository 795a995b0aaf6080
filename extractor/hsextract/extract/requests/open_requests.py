"""The rows whose request is open, and the watchdog that notices when none of them settles.

A row is open from its first request until it is written or recorded. The watchdog exports the
age of the oldest open row (``hsextract_oldest_open_request_seconds``, which the
``HsextractExtractionStalled`` alert reads) and, when no row has settled for ``stall_timeout_s``
while rows are open, logs which rows are open and for how long and sends again the requests the
server has no trace of (no dump directory at all): a request lost on its way in is not waited on
for ``request_timeout_s``. While the server is down (the run's :class:`ServerGate` waits for it),
no row can settle: the watchdog then says that the run waits for the server and resends nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.requests.client import PendingAnswer

log = logging.getLogger(__name__)

#: open rows named in one watchdog log line (the oldest first)
LISTED = 20


@dataclass(eq=False)
class OpenRequest:
    row: int
    rid: str
    directory: Path
    opened: float = field(default_factory=time.monotonic)
    pending: PendingAnswer | None = None  # the request of the current attempt
    # the request the watchdog cancelled to have it sent again; only that one is resent
    _resend_of: PendingAnswer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, pending: PendingAnswer) -> None:
        with self._lock:
            self.pending = pending

    def request_resend(self) -> bool:
        """Cancel the request now open and have the row's worker send it again. False when no request
        is open (the worker waits between tries, or reads the dump): nothing to resend, and a later
        request of the row must not be taken for this one."""
        with self._lock:
            pending = self.pending
            if pending is None or pending.done():
                return False
            self._resend_of = pending
        pending.cancel()
        return True

    def take_resend(self) -> bool:
        """True once after :meth:`request_resend`, while the cancelled request is still the current one."""
        with self._lock:
            wanted = self._resend_of is not None and self._resend_of is self.pending
            self._resend_of = None
            return wanted


class OpenRequests:
    """Thread-safe registry of the open rows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, OpenRequest] = {}

    def open(self, row: int, rid: str, directory: Path) -> OpenRequest:
        entry = OpenRequest(row, rid, directory)
        with self._lock:
            self._open[row] = entry
        return entry

    def close(self, entry: OpenRequest) -> None:
        with self._lock:
            if self._open.get(entry.row) is entry:
                del self._open[entry.row]

    def oldest_first(self) -> list[OpenRequest]:
        with self._lock:
            return sorted(self._open.values(), key=lambda e: e.opened)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def has_trace(directory: Path) -> bool:
    """Whether the server left anything for this request (its dump directory exists, even partly)."""
    try:
        os.lstat(directory)
    except FileNotFoundError:
        return False
    return True


class StallWatchdog:
    """Checks every ``interval_s`` on its own thread; :meth:`check` is one pass (tests call it)."""

    def __init__(
        self,
        requests: OpenRequests,
        ledger: Ledger,
        metrics: ExtractMetrics,
        stall_timeout_s: float,
        interval_s: float = 1.0,
        trace: Callable[[Path], bool] = has_trace,
        down_since: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.requests = requests
        self.ledger = ledger
        self.metrics = metrics
        self.stall_timeout_s = stall_timeout_s
        self.interval_s = interval_s
        self._trace = trace
        self._down_since = down_since  # ServerGate.down_since: when the outage being waited through began
        self._last_alarm = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="hsextract-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.metrics.oldest_open.set(0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()

    def check(self, now: float | None = None) -> int:
        """Update the oldest-open gauge; on a stall, log the open rows and resend the traceless ones.
        Returns how many were sent again."""
        now = time.monotonic() if now is None else now
        entries = self.requests.oldest_first()
        self.metrics.oldest_open.set(now - entries[0].opened if entries else 0.0)
        quiet = now - max(self.ledger.last_settled, self._last_alarm)
        if not entries or quiet < self.stall_timeout_s:
            return 0
        self._last_alarm = now
        down_since = self._down_since()
        if down_since is not None:  # nothing can settle, and a resend would only meet the refused connection
            log.warning(
                "no row settled for %.0f s: the server is down (no connection for %.0f s) and the run is waiting for "
                "it to come back (--server-down-timeout-s); %d rows wait with it, none is failed or sent again",
                quiet,
                now - down_since,
                len(entries),
            )
            return 0
        traced = [(e, self._trace(e.directory)) for e in entries]
        traceless = [e for e, trace in traced if not trace and now - e.opened >= self.stall_timeout_s]
        sent_again = [e for e in traceless if e.request_resend()]
        self.metrics.resends.inc(len(sent_again))
        listed = ", ".join(
            f"row {e.row} {now - e.opened:.0f} s ({'dump started' if trace else 'no trace on the server'})"
            for e, trace in traced[:LISTED]
        )
        more = f" and {len(entries) - LISTED} more" if len(entries) > LISTED else ""
        log.warning(
            "no row settled for %.0f s while %d requests are open: %s%s; sending again the %d the server has no trace of "
            "(docs/runbooks/extraction-stalled.md)",
            quiet,
            len(entries),
            listed,
            more,
            len(sent_again),
        )
        return len(sent_again)
