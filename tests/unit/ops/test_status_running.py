"""``hsextract status`` during a run started without ``--metrics-port``, and with no output to read (issue 29,
item 6): the output's extract.lock, held by a live extractor, says it runs; a missing output is said."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hsextract.dev.sample_data import make_sample_data
from hsextract.ops import fleet
from hsextract.ops import status as ops_status
from hsextract.ops.inventory import Target


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def extractor_without_metrics(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real ``hsextract extract`` without --metrics-port, holding its output's lock while it waits for a server."""
    dataset = make_sample_data(tmp_path / "rows.jsonl", 4, vocab_size=256, seed=0)
    output = tmp_path / "out"
    output.mkdir()  # an existing output is locked before the health wait
    server = f"http://127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "hsextract", "extract", "--server", server, "--dataset", str(dataset),
               "--output", str(output), "--health-timeout-s", "120"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = output / "extract.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip()):
        assert process.poll() is None and time.monotonic() < deadline, "the extractor did not take its lock"
        time.sleep(0.1)
    yield process, output
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(30)


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
