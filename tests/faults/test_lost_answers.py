"""The dump, not the HTTP answer, finishes a row (issue 16).

A real HTTP server in front of the real embedded server forwards every request, so every dump is
written, but holds back the answer of one row: for 30 s, or for good. The run must go on from the
complete dump, write every row once, count the late answer, and end byte-identical to a clean run.
A request that never reaches the server is sent again by the stall watchdog. And 2000 short rows
at concurrency 256 against the embedded server (uvicorn front) are each taken up within seconds, not
minutes, of their dump.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hsextract.contract.rids import parse_rid
from hsextract.extract.metrics import ExtractMetrics
from hsextract.output.verify import verify_output

from ..helpers import run_extraction
from .helpers import Answer, Proxy, assert_same_output, make_rows, run_extract, write_rows

HELD_ROW = 5


def _rows(body: bytes) -> list[int]:
    """The rows a /generate body carries (a list of rids when several rows share it)."""
    rid = json.loads(body).get("rid")
    parsed = [parse_rid(each) for each in (rid if isinstance(rid, list) else [rid])]
    return [each.row for each in parsed if each is not None]


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
        if HELD_ROW in _rows(body):
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

    # timeout: request_timeout_s is 600 s and the held answer 30 s or never; only the dump can end this in time.
    # One row a request: the answer held is that row's alone
    extra = ("--dump-dir", str(server.dump_dir), "--answer-grace-s", "1", "--rows-per-request", "1")
    done = run_extract(front.url, dataset, output, *extra, timeout=25)
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
        if path == "/generate" and HELD_ROW in _rows(body) and not swallowed:
            swallowed.append(HELD_ROW)
            release.wait()  # lost on its way in: never forwarded, never answered
        return None

    front = proxy(server.url, rule)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(8, seed=12))
    output = tmp_path / "out"
    extra = ("--dump-dir", str(server.dump_dir), "--stall-timeout-s", "3", "--rows-per-request", "1")
    done = run_extract(front.url, dataset, output, *extra, timeout=60)
    assert done.returncode == 0, done.stderr
    assert swallowed == [HELD_ROW]
    assert f"row {HELD_ROW} " in done.stderr and "no trace on the server" in done.stderr, done.stderr
    assert "sending again the 1 the server has no trace of" in done.stderr
    assert len((output / "samples.jsonl").read_text().splitlines()) == 8


def test_rows_of_one_post_dumped_seconds_apart_are_not_counted_late(models, start_server, proxy, tmp_path: Path) -> None:
    """A POST of several rows is answered once its last row is dumped: an early row's answer waits for the others,
    which is not late. The proxy sends the first POST of several rows on to the server a row at a time, 2.5 s apart
    (the first row dumped, the next 2.5 s later, ...), and answers it once the last is done; the grace is 1 s."""
    server = start_server(models["main"])
    split: list[list[int]] = []

    def rule(method: str, path: str, body: bytes) -> Answer | None:
        if path != "/generate" or split:
            return None
        request = json.loads(body)
        if not isinstance(request.get("rid"), list):
            return None
        split.append(_rows(body))
        answers = []
        for i, (rid, ids) in enumerate(zip(request["rid"], request["input_ids"], strict=True)):
            if i:
                time.sleep(2.5)
            one = {**request, "rid": rid, "input_ids": ids}
            answers.append(httpx.post(server.url + path, json=one, timeout=120).json())
        return Answer(200, json.dumps(answers).encode())

    front = proxy(server.url, rule)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(8, seed=14))
    output = tmp_path / "out"
    # two request slots at concurrency 8: the rows sent while both are out share the next POST
    extra = ("--dump-dir", str(server.dump_dir), "--answer-grace-s", "1", "--concurrency", "8")
    done = run_extract(front.url, dataset, output, *extra, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(split) == 1 and len(split[0]) >= 2, split
    assert "is not waited on" not in done.stderr, done.stderr
    assert "; 0 rows written before their HTTP answer came" in done.stdout, done.stdout
    # at 8 rows in flight the server batches otherwise than a run at one (README, "What identical means"): the
    # output verifies and holds every row once, not the one-at-a-time run's bytes
    assert verify_output(output).ok
    rows = [json.loads(line)["row"] for line in (output / "samples.jsonl").read_text().splitlines()]
    assert sorted(rows) == list(range(8)), "every row written exactly once"


def test_2000_rows_at_concurrency_256_are_each_taken_up_soon_after_their_dump(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"], max_batch_tokens=4096)
    rows = make_rows(2000, seed=13, lengths=(4, 24))
    dataset = write_rows(tmp_path / "data.jsonl", rows)
    metrics = ExtractMetrics()
    summary = run_extraction(server.url, dataset, tmp_path / "out", concurrency=256, metrics=metrics)
    assert summary.total_samples == 2000 and summary.failed == 0
    # The longest any complete dump waited for the extractor (from its done marker to being taken up). The defect this
    # guards against left dumps waiting for the watchdog or dump_timeout_s (minutes). A dump is taken up inside its
    # packing turn, behind up to 255 others on this 2-core machine shared with the server: a CI run saw 3.04 s (the
    # bound was 3.0 s), so the bound is the stall side's, with room for a loaded machine.
    assert summary.longest_dump_pickup_s < 10.0, summary.longest_dump_pickup_s
    pickups = metrics.registry.get_sample_value("hsextract_dump_pickup_seconds_count")
    assert pickups == 2000
    assert metrics.registry.get_sample_value("hsextract_oldest_open_request_seconds") == 0
