"""The open rows and the stall watchdog, on a given clock."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from hsextract.extract.ledger import Ledger
from hsextract.extract.manifest import Manifest
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.open_requests import OpenRequests, StallWatchdog, has_trace


def _setup(tmp_path: Path, stall_s: float = 60.0) -> tuple[OpenRequests, Ledger, StallWatchdog]:
    metrics = ExtractMetrics()
    ledger = Ledger(
        Manifest(tmp_path), metrics, tmp_path, threading.Event(), max_attempts=1, max_consecutive_failures=9, server_url="u"
    )
    requests = OpenRequests()
    return requests, ledger, StallWatchdog(requests, ledger, metrics, stall_s)


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
    t0 = max(lost.opened, busy.opened, ledger.last_settled)
    assert watchdog.check(now=t0 + 30) == 0, "not stalled yet"
    with caplog.at_level(logging.WARNING):
        assert watchdog.check(now=t0 + 61) == 1
    assert lost.take_resend() and not busy.take_resend()
    assert "row 3 " in caplog.text and "no trace on the server" in caplog.text and "dump started" in caplog.text
    assert ledger.metrics.registry.get_sample_value("hsextract_watchdog_resends_total") == 1
    assert watchdog.check(now=t0 + 62) == 0, "one alarm per stall period"
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
