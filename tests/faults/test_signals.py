"""SIGTERM while a request hangs (the server process stopped with SIGSTOP): the run ends promptly
with its summary, the hanging request is cancelled and not counted as failed, and the rerun (with
the server continued) completes with nothing left in the dump dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ..helpers import run_extraction
from .helpers import assert_same_output, make_rows, run_extract, samples_written, start_extract, wait_for, write_rows

#: far below the request timeout (600 s): only a cancelled request lets the run end within it
STOP_BOUND_S = 60


def test_sigterm_while_a_request_hangs(models, server_process, tmp_path: Path) -> None:
    server = server_process(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(30, seed=18))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    assert not any(server.dump_dir.iterdir())

    output = tmp_path / "out"
    process = start_extract(server.url, dataset, output)
    wait_for(lambda: samples_written(output) >= 3, what="3 samples", process=process)
    os.kill(server.process.pid, signal.SIGSTOP)  # the server hangs: the request in flight gets no answer
    time.sleep(1.0)
    hanging_at = samples_written(output)
    process.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = process.communicate(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"SIGTERM did not end the run within {STOP_BOUND_S} s: {stderr[-3000:]}") from None
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert process.returncode == 130, stderr
    assert "INTERRUPTED" in stdout and "SIGTERM" in stderr and "rerun the same command to resume" in stderr
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "interrupted" and config["total_samples"] == hanging_at
    assert (output / "errors.jsonl").read_text() == "", "the cancelled request was recorded as failed"

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)
    assert not any(server.dump_dir.iterdir()), "the cancelled request's dump was left in the dump dir"
