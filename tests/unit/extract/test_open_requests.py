"""The open rows and the stall watchdog, on a given clock."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from hsextract.contract.generate import GenerateAnswer, GenerateRequest
from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.requests.client import PendingAnswer
from hsextract.extract.requests.open_requests import OpenRequests, StallWatchdog, has_trace
from hsextract.output.manifest import Manifest


def _setup(tmp_path: Path, stall_s: float = 60.0) -> tuple[OpenRequests, Ledger, StallWatchdog]:
    metrics = ExtractMetrics()
    ledger = Ledger(
        Manifest(tmp_path), metrics, tmp_path, threading.Event(), max_attempts=1, max_consecutive_failures=9, server_url="u"
    )
    requests = OpenRequests()
    return requests, ledger, StallWatchdog(requests, ledger, metrics, stall_s)


def _pending(rid: str) -> PendingAnswer:
    """A request under way: its answer comes when the test sets it; cancel() fails it, as the client does."""
    future: Future[GenerateAnswer] = Future()

    def cancel() -> None:
        future.cancel()

    return PendingAnswer(GenerateRequest(rid, [1, 2, 3]), future, cancel)


def test_the_gauge_is_the_age_of_the_oldest_open_row(tmp_path: Path) -> None:
    requests, ledger, watchdog = _setup(tmp_path)
    first = requests.open(1, "hsx-000000001-n3", tmp_path / "a")
    second = requests.open(2, "hsx-000000002-n3", tmp_path / "b")
    gauge = "hsextract_oldest_open_request_seconds"
    watchdog.check(now=first.opened + 12)
    assert ledger.metrics.registry.get_sample_value(gauge) == pytest.approx(12)
    requests.close(first)
    watchdog.check(now=second.opened + 5)
    assert ledger.metrics.registry.get_sample_value(gauge) == pytest.approx(5)
    requests.close(second)
    watchdog.check()
    assert ledger.metrics.registry.get_sample_value(gauge) == 0 and len(requests) == 0


def test_a_stall_logs_the_open_rows_and_resends_only_those_without_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    requests, ledger, watchdog = _setup(tmp_path, stall_s=60)
    started = tmp_path / "started"
    started.mkdir()  # the server began this dump
    lost = requests.open(3, "hsx-000000003-n3", tmp_path / "missing")
    busy = requests.open(4, "hsx-000000004-n3", started)
    lost_request = _pending(lost.rid)
    lost.sent(lost_request)
    busy.sent(_pending(busy.rid))
    t0 = max(lost.opened, busy.opened, ledger.last_settled)
    assert watchdog.check(now=t0 + 30) == 0, "not stalled yet"
    with caplog.at_level(logging.WARNING):
        assert watchdog.check(now=t0 + 61) == 1
    assert lost_request.done(), "the lost request is cancelled before it is sent again"
    assert lost.take_resend() and not busy.take_resend()
    assert "row 3 " in caplog.text and "no trace on the server" in caplog.text and "dump started" in caplog.text
    assert ledger.metrics.registry.get_sample_value("hsextract_watchdog_resends_total") == 1
    assert watchdog.check(now=t0 + 62) == 0, "one alarm per stall period"
    lost.sent(_pending(lost.rid))  # the worker sent it again
    assert watchdog.check(now=t0 + 122) == 1


def test_a_settled_row_resets_the_stall_clock(tmp_path: Path) -> None:
    requests, ledger, watchdog = _setup(tmp_path, stall_s=60)
    entry = requests.open(5, "hsx-000000005-n3", tmp_path / "x")
    ledger.last_settled = entry.opened + 50
    assert watchdog.check(now=entry.opened + 70) == 0


def test_has_trace_does_not_follow_or_need_a_complete_dump(tmp_path: Path) -> None:
    assert not has_trace(tmp_path / "nothing")
    (tmp_path / "link").symlink_to(tmp_path / "nothing")
    assert has_trace(tmp_path / "link")


def test_a_resend_asked_between_requests_is_not_taken_by_the_next_request(tmp_path: Path) -> None:
    """The row's last request is over (the worker waits to retry, or reads a late dump): nothing is
    resent, and the row's next request is not cancelled for it. Before, the flag outlived the request
    it was meant for: the next request was sent and then sent again at once under the same rid while
    the first was still open, and SGLang's 400 for the duplicate rid recorded the row as bad input."""
    requests, ledger, watchdog = _setup(tmp_path, stall_s=60)
    entry = requests.open(6, "hsx-000000006-n3", tmp_path / "missing")
    answered = _pending(entry.rid)
    answered._future.set_result(GenerateAnswer(entry.rid, 3))
    entry.sent(answered)  # answered; its dump never came: the worker is between tries
    assert not entry.request_resend()
    assert watchdog.check(now=max(entry.opened, ledger.last_settled) + 61) == 0
    assert ledger.metrics.registry.get_sample_value("hsextract_watchdog_resends_total") == 0
    following = _pending(entry.rid)
    entry.sent(following)  # the next try
    assert not entry.take_resend() and not following.done()


def test_only_the_request_that_was_cancelled_is_resent(tmp_path: Path) -> None:
    entry = OpenRequests().open(7, "hsx-000000007-n3", tmp_path / "missing")
    first = _pending(entry.rid)
    entry.sent(first)
    assert entry.request_resend() and first.done()
    entry.sent(_pending(entry.rid))  # the worker already moved on to another try
    assert not entry.take_resend()


def test_a_stall_during_a_server_outage_says_the_run_waits_for_the_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import socket
    import time

    from hsextract.errors import ServerUnreachableError
    from hsextract.extract.requests.client import ServerClient
    from hsextract.extract.requests.server_gate import ServerGate

    requests, ledger, _ = _setup(tmp_path)
    with socket.socket() as probe:  # a port nothing listens on: the server is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ServerClient(f"http://127.0.0.1:{port}")
    gate = ServerGate(client, ledger, ledger.metrics, timeout_s=60)
    watchdog = StallWatchdog(requests, ledger, ledger.metrics, 60, down_since=gate.down_since)
    assert gate.down_since() is None
    entry = requests.open(7, "hsx-000000007-n3", tmp_path / "missing")  # no trace: would be resent if the server were up
    waiting = threading.Thread(target=gate.wait_until_back, args=(ServerUnreachableError("refused"),))
    waiting.start()
    try:
        deadline = time.monotonic() + 10
        while gate.down_since() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.down_since() is not None
        with caplog.at_level(logging.WARNING, logger="hsextract.extract.requests.open_requests"):
            assert watchdog.check(now=max(entry.opened, ledger.last_settled) + 61) == 0, "nothing resent during an outage"
        assert "the server is down" in caplog.text and "waiting for it to come back" in caplog.text
        assert "sending again" not in caplog.text
    finally:
        ledger.stop.set()
        waiting.join(timeout=15)
        client.close()
    assert not waiting.is_alive()
