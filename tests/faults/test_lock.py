"""One extractor per output, and one per server and shard: a second one exits at once, naming the holder; the
first one is unharmed."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

from ..helpers import run_extraction
from .helpers import assert_same_output, make_rows, run_extract, samples_written, start_extract, wait_for, write_rows


def _second_while_the_first_is_mid_run(
    server, proxy, dataset: Path, first_output: Path, second_output: Path
) -> tuple[subprocess.Popen[str], subprocess.CompletedProcess[str]]:
    """The first extractor held on its fourth request (behind a proxy, the server's dump folder named), the
    second one run meanwhile against the server itself."""
    release = threading.Event()
    holding = threading.Event()

    def hold_after_three(method: str, path: str, body: bytes) -> None:
        if path == "/generate" and front.generate_calls > 3:
            holding.set()
            release.wait(120)  # the first extractor waits here, a request in flight, while the second one starts
        return None

    front = proxy(server.url, hold_after_three)
    first = start_extract(front.url, dataset, first_output, "--dump-dir", str(server.dump_dir))
    try:
        wait_for(holding.is_set, what="the first extractor to be mid-run", process=first)
        second = run_extract(server.url, dataset, second_output, timeout=60)
    finally:
        release.set()
    return first, second


def test_second_extractor_on_one_output_exits_at_once(models, start_server, proxy, tmp_path: Path) -> None:
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(10, seed=14))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)

    output = tmp_path / "out"
    first, second = _second_while_the_first_is_mid_run(server, proxy, dataset, output, output)
    assert second.returncode == 1, second.stderr
    assert "OutputLockedError" in second.stderr
    assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr
    assert samples_written(output) == 3, "the second extractor wrote into the output"

    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert not (output / "extract.lock").exists()
    assert_same_output(output, reference)


def test_lock_of_a_killed_extractor_does_not_block_the_rerun(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(10, seed=15))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    output = tmp_path / "out"
    process = start_extract(server.url, dataset, output)
    wait_for(lambda: (output / "extract.lock").exists() and samples_written(output) >= 1, what="the lock", process=process)
    process.kill()
    process.wait()
    assert (output / "extract.lock").exists(), "the killed extractor could not have removed its lock file"
    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


def test_second_extractor_of_one_shard_on_one_server_exits_at_once(models, start_server, proxy, tmp_path: Path) -> None:
    """Another output, the same server and shard: the same request ids for the same rows. Before the dump folder's
    lock the second one's start-up sweep removed the first one's in-flight dumps, and each could take the other's."""
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(10, seed=16))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)

    first_output = tmp_path / "first"
    first, second = _second_while_the_first_is_mid_run(server, proxy, dataset, first_output, tmp_path / "second")
    assert second.returncode == 1, second.stderr
    assert "OutputLockedError" in second.stderr and "shard 0 of 1" in second.stderr
    assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr and str(first_output) in second.stderr
    assert samples_written(tmp_path / "second") == 0

    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert not list(Path(server.dump_dir).glob(".hsextract-*.lock")), "the lock file outlived its run"
    assert_same_output(first_output, reference)
    other_shard = run_extract(server.url, dataset, tmp_path / "shard1", "--shard-index", "1", "--num-shards", "2")
    assert other_shard.returncode == 0, other_shard.stderr  # the guard is per shard
