"""The request threads' hand-off (``http_threads._HandOff``): work handed over without a Python lock, a waiting
thread reused before another is started, at most ``max_threads`` of them, and a shutdown that runs what was
queued and stops every thread."""

from __future__ import annotations

import functools
import threading

from hsextract.extract.requests.http_threads import _HandOff


def test_a_waiting_thread_takes_the_next_work() -> None:
    hand_off = _HandOff(max_threads=8, name="test-hand-off")
    names: list[str] = []
    done = threading.Event()

    def note_thread() -> None:
        names.append(threading.current_thread().name)
        done.set()

    for _ in range(20):  # one at a time: the thread that ran the last one is waiting again
        done.clear()
        hand_off.submit(note_thread)
        assert done.wait(10)
    hand_off.shutdown()
    assert len(names) == 20 and len(set(names)) <= 2  # 1, or 2 when a submit came before the token was back


def test_work_beyond_the_cap_waits_for_a_thread() -> None:
    hand_off = _HandOff(max_threads=2, name="test-hand-off")
    release, started = threading.Event(), threading.Semaphore(0)
    ran: list[int] = []

    def held(i: int) -> None:
        started.release()
        assert release.wait(10)
        ran.append(i)

    for i in range(3):
        hand_off.submit(functools.partial(held, i))
    assert started.acquire(timeout=10) and started.acquire(timeout=10)
    assert not started.acquire(timeout=0.3)  # the third waits: both threads are busy
    release.set()
    assert started.acquire(timeout=10)  # a thread came free and took it
    hand_off.shutdown()
    assert sorted(ran) == [0, 1, 2]
    assert {t.name for t in threading.enumerate()} & {"test-hand-off_0", "test-hand-off_1", "test-hand-off_2"} == set()


def test_shutdown_runs_what_was_queued_and_survives_a_failing_work() -> None:
    hand_off = _HandOff(max_threads=1, name="test-hand-off")
    release = threading.Event()
    ran: list[str] = []

    def first() -> None:
        assert release.wait(10)
        ran.append("first")

    def fail() -> None:
        raise RuntimeError("a bug in the work")

    hand_off.submit(first)
    hand_off.submit(fail)
    hand_off.submit(functools.partial(ran.append, "queued"))
    release.set()
    hand_off.shutdown()
    assert ran == ["first", "queued"]  # the failure was logged and its thread went on
