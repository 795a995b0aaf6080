"""A server that goes away mid-run: killed and started again (systemd, ``make restart``), or gone.

The extractor runs as its own process against the embedded server as its own process; the server
is SIGKILLed mid-run. Started again on the same port, the run waits for it, fails no row, and ends
byte-identical to a clean run (at concurrency 1, where batching cannot change a value). Never started
again, the run (at concurrency 4: one wait for all the rows in flight) stops after
``--server-down-timeout-s`` with the fix in its message and no row recorded as failed (a rerun does them).

Before, each row in flight spent its three tries (1 s + 2 s of backoff) against the refused
connection, eight such rows stopped the run on the breaker, and the rows were recorded as failed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .helpers import (
    assert_same_output,
    make_rows,
    run_extract,
    samples_written,
    start_extract,
    wait_for,
    write_rows,
)

#: longer than a row's three tries take (1 s + 2 s of backoff): before, the rows in flight failed
OUTAGE_S = 5.0


def _failed_rows(output: Path) -> list[dict[str, object]]:
    path = output / "errors.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if r["kind"] == "failed"]


def test_a_server_killed_and_started_again_mid_run_is_waited_for_and_no_row_fails(models, server_process, tmp_path: Path) -> None:
    first = server_process(models["main"])
    port = int(first.url.rsplit(":", 1)[1])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(24, seed=21))
    output = tmp_path / "out"
    extract = start_extract(first.url, dataset, output, "--dump-dir", str(first.dump_dir))  # concurrency 1: bit-exact
    wait_for(lambda: samples_written(output) >= 6, what="6 samples", process=extract)
    first.process.kill()
    first.process.wait()
    time.sleep(OUTAGE_S)
    second = server_process(models["main"], first.dump_dir, port=port)
    stdout, stderr = extract.communicate(timeout=240)
    assert extract.returncode == 0, stderr[-3000:]
    assert "the server stopped taking connections" in stderr and "the server is back after" in stderr, stderr[-3000:]
    assert "waited through 1 server outage(s) mid-run" in stdout, stdout
    assert _failed_rows(output) == []

    reference = tmp_path / "reference"
    clean = run_extract(second.url, dataset, reference, "--dump-dir", str(second.dump_dir))
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert_same_output(output, reference)


def test_a_server_that_stays_away_stops_the_run_and_fails_no_row(models, server_process, tmp_path: Path) -> None:
    server = server_process(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(16, seed=22))
    output = tmp_path / "out"
    extract = start_extract(
        server.url, dataset, output, "--dump-dir", str(server.dump_dir), "--concurrency", "4", "--server-down-timeout-s", "3"
    )
    wait_for(lambda: samples_written(output) >= 4, what="4 samples", process=extract)
    server.process.kill()
    server.process.wait()
    _, stderr = extract.communicate(timeout=120)
    assert extract.returncode == 1, stderr[-3000:]
    assert "did not come back within 3 s (--server-down-timeout-s)" in stderr and "rerun the same command" in stderr
    assert _failed_rows(output) == []
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and config["total_samples"] == samples_written(output) < 16
