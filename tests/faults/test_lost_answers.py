"""The dump, not the HTTP answer, finishes a row (issue 16).

A real HTTP server in front of the real embedded server forwards every request, so every dump is
written, but holds back the answer of one row: for 30 s, or for good. The run must go on from the
complete dump, write every row once, count the late answer, and end byte-identical to a clean run.
A request that never reaches the server is sent again by the stall watchdog. And 2000 short rows
at concurrency 256 against the embedded server (uvicorn front) are each taken up within a few
seconds of their dump.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hsextract.contract.rids import parse_rid
from hsextract.extract.metrics import ExtractMetrics

from ..helpers import run_extraction
from .helpers import Answer, Proxy, assert_same_output, make_rows, run_extract, write_rows

HELD_ROW = 5


def _row(body: bytes) -> int | None:
    rid = parse_rid(json.loads(body).get("rid"))
    return None if rid is None else rid.row


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # lets a held proxy thread go at the end of the test


def _hold_answer(upstream: str, hold_s: float | None, release: threading.Event) -> object:
    def rule(method: str, path: str, body: bytes) -> Answer | None:
        if path != "/generate":
            return None
        response = httpx.post(upstream + path, content=body, timeout=120)  # the server prefills and dumps
        if _row(body) == HELD_ROW:
            release.wait(hold_s)  # ... and its answer is held back
        return Answer(response.status_code, response.content)

    return rule


@pytest.mark.parametrize("hold_s", [30.0, None], ids=["answer-after-30s", "answer-never"])
def test_a_row_whose_answer_is_held_is_written_from_its_dump(
    hold_s: float | None, release: threading.Event, models, start_server, proxy, tmp_path: Path
) -> None:
    server = start_server(models["main"])
    front: Proxy = proxy(server.url, _hold_answer(server.url, hold_s, release))
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=11))
    output, reference = tmp_path / "out", tmp_path / "reference"

    # timeout: request_timeout_s is 600 s and the held answer 30 s or never; only the dump can end this in time
    done = run_extract(front.url, dataset, output, "--dump-dir", str(server.dump_dir), "--answer-grace-s", "1", timeout=25)
    assert done.returncode == 0, done.stderr
    assert "1 rows written before their HTTP answer came" in done.stdout
    late_lines = [line for line in done.stderr.splitlines() if "is not waited on" in line]
    assert len(late_lines) == 1 and f"row {HELD_ROW} " in late_lines[0], done.stderr
    rows = [json.loads(line)["row"] for line in (output / "samples.jsonl").read_text().splitlines()]
    assert sorted(rows) == list(range(12)), "every row written exactly once"

    run_extraction(server.url, dataset, reference, concurrency=1)
    assert_same_output(output, reference)


def test_the_watchdog_resends_a_request_the_server_never_got(
    release: threading.Event, models, start_server, proxy, tmp_path: Path
) -> None:
    server = start_server(models["main"])
    swallowed: list[int] = []

    def rule(method: str, path: str, body: bytes) -> Answer | None:
        if path == "/generate" and _row(body) == HELD_ROW and not swallowed:
            swallowed.append(HELD_ROW)
            release.wait()  # lost on its way in: never forwarded, never answered
        return None

    front = proxy(server.url, rule)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(8, seed=12))
    output = tmp_path / "out"
    done = run_extract(front.url, dataset, output, "--dump-dir", str(server.dump_dir), "--stall-timeout-s", "3", timeout=60)
    assert done.returncode == 0, done.stderr
    assert swallowed == [HELD_ROW]
    assert f"row {HELD_ROW} " in done.stderr and "no trace on the server" in done.stderr, done.stderr
    assert "sending again the 1 the server has no trace of" in done.stderr
    assert len((output / "samples.jsonl").read_text().splitlines()) == 8


def test_2000_rows_at_concurrency_256_are_each_taken_up_soon_after_their_dump(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"], max_batch_tokens=4096)
    rows = make_rows(2000, seed=13, lengths=(4, 24))
    dataset = write_rows(tmp_path / "data.jsonl", rows)
    metrics = ExtractMetrics()
    summary = run_extraction(server.url, dataset, tmp_path / "out", concurrency=256, metrics=metrics)
    assert summary.total_samples == 2000 and summary.failed == 0
    # the longest any complete dump waited for the extractor (from its done marker to being taken up)
    assert summary.longest_dump_pickup_s < 3.0, summary.longest_dump_pickup_s
    pickups = metrics.registry.get_sample_value("hsextract_dump_pickup_seconds_count")
    assert pickups == 2000
    assert metrics.registry.get_sample_value("hsextract_oldest_open_request_seconds") == 0
