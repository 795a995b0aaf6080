"""Drain: how the embedded server's routes wait for the engine's answers, and end those waits at shutdown."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from hsextract.capture.front.drain import Drain, ShuttingDown


def test_a_wait_returns_the_answer_set_from_another_thread() -> None:
    async def main() -> str:
        drain = Drain(grace_s=5)
        future: Future[str] = Future()
        threading.Timer(0.05, future.set_result, args=("answer",)).start()
        result = await drain.wait(future, timeout=5)
        assert drain.open_requests == 0
        return result

    assert asyncio.run(main()) == "answer"


def test_a_failed_answer_raises_its_error() -> None:
    async def main() -> None:
        future: Future[str] = Future()
        future.set_exception(RuntimeError("out of memory"))
        await Drain(grace_s=5).wait(future, timeout=5)

    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(main())


def test_a_wait_times_out_and_the_engine_future_is_left_alone() -> None:
    future: Future[str] = Future()

    async def main() -> None:
        await Drain(grace_s=5).wait(future, timeout=0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert not future.cancelled()  # the engine still forwards and dumps it; only the HTTP wait ended


def test_open_waits_end_when_the_grace_after_begin_runs_out() -> None:
    async def main() -> tuple[float, int]:
        drain = Drain(grace_s=0.2)
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[str]] = [asyncio.ensure_future(drain.wait(Future(), timeout=60)) for _ in range(3)]
        await asyncio.sleep(0.01)
        open_then = drain.open_requests
        began = loop.time()
        drain.begin()
        for wait in waits:
            with pytest.raises(ShuttingDown):
                await wait
        return loop.time() - began, open_then

    took, open_then = asyncio.run(main())
    assert open_then == 3 and 0.2 <= took < 2


def test_an_answer_within_the_grace_is_still_returned() -> None:
    async def main() -> str:
        drain = Drain(grace_s=1)
        future: Future[str] = Future()
        drain.begin()
        threading.Timer(0.05, future.set_result, args=("late but in time",)).start()
        return await drain.wait(future, timeout=60)

    assert asyncio.run(main()) == "late but in time"
