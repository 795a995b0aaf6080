"""``hsextract status`` during a run started without ``--metrics-port``, and with no output to read (issue 29,
item 6): the output's extract.lock, held by a live extractor, says it runs; a missing output is said."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hsextract.dev.sample_data import make_sample_data
from hsextract.ops import fleet
from hsextract.ops import status as ops_status
from hsextract.ops.inventory import Target

from ..answering_http import answering


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _extractor(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real ``hsextract extract`` holding its output's lock while it waits for a server that never answers."""
    dataset = make_sample_data(tmp_path / "rows.jsonl", 4, vocab_size=256, seed=0)
    output = tmp_path / "out"
    output.mkdir()  # an existing output is locked before the health wait
    server = f"http://127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "hsextract", "extract", "--server", server, "--dataset", str(dataset),
               "--output", str(output), "--health-timeout-s", "120", *extra]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = output / "extract.lock"
    deadline = time.monotonic() + 60
    try:
        while not (lock.exists() and lock.read_text().strip()):
            assert process.poll() is None and time.monotonic() < deadline, "the extractor did not take its lock"
            time.sleep(0.1)
        yield process, output
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)


@pytest.fixture
def extractor_without_metrics(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real ``hsextract extract`` without --metrics-port, holding its output's lock while it waits for a server."""
    with _extractor(tmp_path) as started:
        yield started


def test_an_extractor_without_metrics_is_seen_running_by_its_lock(extractor_without_metrics, tmp_path: Path) -> None:
    process, output = extractor_without_metrics
    port = _free_port()  # nothing answers: the extractor has no metrics endpoint
    target = Target("here", server_port=port, metrics_port=port, output_dir=str(output))
    [status] = ops_status.gather_all([target])
    text = ops_status.render(status)
    assert status.lock_holder is not None and status.lock_holder.pid == process.pid, text
    assert "extraction: running; " in text and f"pid {process.pid}" in text and "--metrics-port" in text
    assert "the extractor is not running" not in text
    assert fleet.shard_progress(status, target).state == "running"

    # killed: its lock file stays behind, naming a dead pid, but nothing holds the lock any more
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert (output / "extract.lock").exists()
    [status] = ops_status.gather_all([target])
    assert status.lock_holder is None and "the extractor is not running" in ops_status.render(status)


def test_a_missing_output_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    monkeypatch.chdir(tmp_path)  # a directory with no work/output: status without --output-dir
    target = Target("here", server_port=port, metrics_port=port, output_dir="work/output")
    [status] = ops_status.gather_all([target])
    text = ops_status.render(status)
    assert f"output work/output (under {tmp_path}): no such directory on this host; give --output-dir" in text
    present = Target("here", server_port=port, metrics_port=port, output_dir=str(tmp_path))
    [status] = ops_status.gather_all([present])
    assert status.output_missing is None and "no such directory" not in ops_status.render(status)


def test_the_lock_check_is_by_pid_in_proc_locks() -> None:
    assert os.path.exists("/proc/locks")  # what the status command reads: Linux hosts only
    assert ops_status.parse_lock_holder('{"pid": 7, "host": "h", "since": "s"}\n\nwritten 3\n') is None
    holder = ops_status.parse_lock_holder('{"pid": 7, "host": "h", "since": "s"}\n\nholder 7\nwritten 3\n')
    assert holder == ops_status.LockHolder(7, "h", "s", 3)


# -- issue 39 item 9: the metrics port the run records, a port that answers something else, an unknown total --------
METRICS = """hsextract_samples_planned 2000
hsextract_samples_total{status="ok"} 1007
hsextract_running 1
hsextract_tokens_total 50000
hsextract_tokens_planned 100000
hsextract_inflight_requests 4
"""


@pytest.fixture
def http_server() -> Iterator[Callable[[int, str], int]]:
    """start(code, body): a local HTTP server answering every GET with that status and body; returns its port."""
    with contextlib.ExitStack() as servers:
        yield lambda code, body: servers.enter_context(answering(body, code))


def _held_lock(output: Path, record: dict[str, object], written: int) -> int:
    """The output as a running extractor holds it: extract.lock with ``record``, flocked by this process; ``written``
    lines of samples.jsonl. Returns the lock's descriptor (closing it releases the lock)."""
    output.mkdir(exist_ok=True)
    (output / "samples.jsonl").write_text("".join(f'{{"row": {i}}}\n' for i in range(written)))
    fd = os.open(output / "extract.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, (json.dumps({"pid": os.getpid(), "host": "h", "since": "s", **record}) + "\n").encode())
    return fd


def test_a_run_with_metrics_is_read_on_the_port_its_lock_records(http_server: Callable[[int, str], int],
                                                                  tmp_path: Path) -> None:
    """`hsextract status --output-dir D` (default --metrics-port) during `extract --metrics-port P` said the run had no
    metrics endpoint, and its total was 1007/0 samples (0%)."""
    port = http_server(200, METRICS)
    fd = _held_lock(tmp_path / "out", {"metrics_port": port, "metrics_host": "127.0.0.1"}, 1007)
    try:
        target = Target("here", server_port=_free_port(), metrics_port=_free_port(), output_dir=str(tmp_path / "out"))
        [status] = ops_status.gather_all([target])
    finally:
        os.close(fd)
    text = ops_status.render(status)
    assert status.progress is not None and (status.progress.planned, status.progress.settled) == (2000, 1007), text
    assert "1007/2000 samples settled" in text and "without --metrics-port" not in text, text
    total = fleet.render_total(fleet.fleet_total([status], [target]))
    assert "1007/2000 samples (50%)" in total, total


def test_a_port_that_answers_404_is_not_an_hsextract_metrics_endpoint(http_server: Callable[[int, str], int],
                                                                      tmp_path: Path) -> None:
    port = http_server(404, "not found")
    output = tmp_path / "out"
    output.mkdir()
    target = Target("here", server_port=_free_port(), metrics_port=port, output_dir=str(output))
    [status] = ops_status.gather_all([target])
    text = ops_status.render(status)
    assert f"port {port} answers HTTP 404" in text and "not an hsextract metrics endpoint" in text, text
    assert "no answer on port" not in text and "the extractor is not running" not in text, text
    # the same beside a running extractor: it says what answered, not that the run has no endpoint
    fd = _held_lock(output, {}, 5)
    try:
        [status] = ops_status.gather_all([target])
    finally:
        os.close(fd)
    text = ops_status.render(status)
    assert "extraction: running; " in text and f"port {port} answers HTTP 404" in text, text
    assert "runs without --metrics-port" not in text, text


def test_the_total_of_a_run_without_metrics_is_unknown_not_zero(tmp_path: Path) -> None:
    fd = _held_lock(tmp_path / "out", {"metrics_port": None}, 1007)
    try:
        port = _free_port()
        target = Target("here", server_port=port, metrics_port=port, output_dir=str(tmp_path / "out"))
        [status] = ops_status.gather_all([target])
    finally:
        os.close(fd)
    text = ops_status.render(status)
    assert "runs without --metrics-port" in text and "samples written so far: 1007" in text, text
    total = fleet.render_total(fleet.fleet_total([status], [target]))
    assert "1007/? samples (?)" in total and "/0 samples" not in total, total
    assert status.progress is not None and status.progress.planned is None


def test_the_extractor_records_its_metrics_port_in_its_lock(tmp_path: Path) -> None:
    """A real `hsextract extract --metrics-port P` waiting for its server: its lock names P, and status, asked on
    another port, says the run's endpoint does not answer yet rather than that it has none."""
    port = _free_port()
    with _extractor(tmp_path, "--metrics-port", str(port)) as (process, output):
        record = json.loads((output / "extract.lock").read_text())
        assert record["metrics_port"] == port and record["pid"] == process.pid
        other = _free_port()
        target = Target("here", server_port=other, metrics_port=other, output_dir=str(output))
        [status] = ops_status.gather_all([target])
        text = ops_status.render(status)
    assert f"--metrics-port {port}" in text and "does not answer yet" in text, text
    assert "runs without --metrics-port" not in text, text
