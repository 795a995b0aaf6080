"""Progress: a bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, total: int, initial: int, total_tokens: int, interval_s: float = 30.0) -> None:
        self.total = total
        self.done = initial
        self.tokens = 0
        self.total_tokens = total_tokens
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._last_log = self.started
        self._bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="sample", dynamic_ncols=True, smoothing=0.05)

    def set_totals(self, total: int, total_tokens: int) -> None:
        """Replace estimated totals with exact ones (the plan is counted while the run goes)."""
        self.total, self.total_tokens = total, total_tokens
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def advance(self, tokens: int = 0) -> None:
        self.done += 1
        self.tokens += tokens
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"{self.tokens / max(1e-9, time.monotonic() - self.started):,.0f} tok/s")
            return
        now = time.monotonic()
        if now - self._last_log >= self.interval_s:
            self._last_log = now
            elapsed = now - self.started
            rate = self.tokens / elapsed if elapsed else 0.0
            left = max(0, self.total_tokens - self.tokens)
            eta = f"{left / rate / 60:.1f} min" if rate else "unknown"
            log.info("progress %d/%d samples, %.0f tokens/s, ETA %s", self.done, self.total, rate, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
