"""The smaller items: metrics series from the start and on loopback, an absolute model path in
data_config.json, and no dumps left behind by requests that timed out."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from hsextract.contract.states import ErrorReason
from hsextract.extract.metrics import SAMPLE_STATUSES

from ..helpers import free_port, run_extraction
from .helpers import assert_same_output, make_rows, run_extract, start_extract, wait_for, write_rows


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on ``port`` (the kernel's own table)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if int(port_hex, 16) == port and state == "0A":
                found.add(address)
    return found


def test_metrics_have_every_series_from_the_start_and_listen_on_loopback(models, start_server, proxy, tmp_path: Path) -> None:
    server = start_server(models["main"])
    release = threading.Event()
    front = proxy(server.url, lambda method, path, body: release.wait(120) and None if path == "/generate" else None)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(2, seed=19))
    port = free_port()
    process = start_extract(front.url, dataset, tmp_path / "out", "--metrics-port", str(port), "--dump-dir", str(server.dump_dir))
    try:
        wait_for(lambda: front.generate_calls >= 1, what="the first request", process=process)  # up, nothing settled
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        addresses = _listening_addresses(port)
    finally:
        release.set()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    for reason in ErrorReason:
        assert f'hsextract_errors_total{{reason="{reason}"}} 0.0' in text, reason
    for status in SAMPLE_STATUSES:
        assert f'hsextract_samples_total{{status="{status}"}}' in text
    assert addresses == {"0100007F"}, f"the metrics endpoint listens on {addresses}, not only 127.0.0.1"


def test_data_config_records_the_model_path_absolute(models, start_server, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(models["main"].parent)
    server = start_server(Path(models["main"].name))  # served as a path relative to where the server started
    monkeypatch.chdir(tmp_path)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(2, seed=20))
    run_extraction(server.url, dataset, tmp_path / "out", concurrency=1)
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["model"]["path"] == str(models["main"].resolve())


def test_dumps_of_timed_out_requests_do_not_stay(models, start_server, proxy, tmp_path: Path) -> None:
    """Row 0's first request is held by a slow link past the request timeout; the retry goes through
    and the row is written; the held request then reaches the server, whose dump nobody reads."""
    server = start_server(models["main"])
    held: list[float] = []

    def slow_first_request(method: str, path: str, body: bytes) -> None:
        if path == "/generate" and not held and "-000000000-" in json.loads(body)["rid"]:
            held.append(time.monotonic())
            time.sleep(4.0)  # then forwarded: the server dumps it long after the extractor gave up on it
        return None

    front = proxy(server.url, slow_first_request)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(2, seed=21))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    output = tmp_path / "out"
    first = run_extract(front.url, dataset, output, "--dump-dir", str(server.dump_dir), "--request-timeout-s", "1")
    assert first.returncode == 0, first.stderr
    wait_for(lambda: any(server.dump_dir.iterdir()), timeout=30, what="the late dump of the timed-out request")

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert list(server.dump_dir.iterdir()) == [], "the dump of the timed-out request stayed in the dump dir"
    assert_same_output(output, reference)
