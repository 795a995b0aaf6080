"""The rids the engine holds, from a request's submit until its future is resolved.

Two requests of one rid at once would write one dump directory (or answer one decode twice): a body is
taken whole or not at all, and SGLang's "Duplicate request ID detected" names the first rid that is held.
Both ``/generate`` routes (the dumping forward and the decode) share one set.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any


class RidsInFlight:
    def __init__(self) -> None:
        self._rids: set[str] = set()
        self._lock = threading.Lock()

    def take(self, rids: Sequence[str]) -> str | None:
        """Hold every rid of one body, or none of them: the rid that is already held (or twice in the body)."""
        taken: set[str] = set()
        with self._lock:
            for rid in rids:
                if rid in self._rids or rid in taken:
                    return rid
                taken.add(rid)
            self._rids |= taken
        return None

    def release(self, rids: Sequence[str]) -> None:
        with self._lock:
            self._rids.difference_update(rids)

    def release_when_done(self, rid: str, future: Future[Any]) -> None:
        """Let ``rid`` go once its ``future`` is resolved (answered, failed or cancelled)."""
        future.add_done_callback(lambda _: self.release((rid,)))
