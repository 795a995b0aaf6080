"""The routes' waits for the engine's answers, and their end at a shutdown.

Every route awaits an engine future through :meth:`Drain.wait`, so the event loop never blocks on a
forward; once a shutdown begins, open requests have the grace period to be answered, then 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import Future
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class ShuttingDown(Exception):
    """The grace period of a shutdown ended before the request's answer (internal: becomes a 503)."""


class Drain:
    """Shutdown of the routes: once :meth:`begin` runs, open requests have ``grace_s`` to finish;
    then every wait still open ends with :class:`ShuttingDown` (a 503 answer)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.open_requests = 0
        self._waiters: set[asyncio.Future[None]] = set()  # each open wait's wake-up
        self._closed = False

    def begin(self) -> None:
        """Start the grace period (call in the serving loop)."""
        if self.open_requests:
            log.info("%d request(s) open: up to %.0f s to answer them, then 503", self.open_requests, self.grace_s)
        asyncio.get_running_loop().call_later(self.grace_s, self._close)

    def _close(self) -> None:
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, future: Future[T], timeout: float) -> T:
        """The future's result; :class:`TimeoutError` after ``timeout``, :class:`ShuttingDown` at the end of the grace.

        One loop future is woken by whichever comes first (the answer, the grace's end, the timeout): every row's
        request waits here, and a task for the grace and ``asyncio.wait`` cost the serving loop's thread more per
        request than the rest of the route."""
        if self._closed:
            raise ShuttingDown
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def answered(_: Future[T]) -> None:  # on the engine's thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(wake)

        future.add_done_callback(answered)
        timer = loop.call_later(timeout, wake)
        self._waiters.add(waiter)
        self.open_requests += 1
        try:
            await waiter
        finally:
            self.open_requests -= 1
            self._waiters.discard(waiter)
            timer.cancel()
        if future.done():
            return future.result()
        if self._closed:
            raise ShuttingDown
        raise TimeoutError
