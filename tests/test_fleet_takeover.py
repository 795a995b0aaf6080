"""A container lost mid-run: another host finishes its shard from the copy of its output, redoing no finished
row, and the shards then merge into one output that verifies (docs/fleet.md, "A container lost for good")."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hsextract.dev.sample_data import make_sample_data
from hsextract.output.manifest import Manifest
from hsextract.output.merge import merge_outputs
from hsextract.output.verify import verify_output

from .helpers import run_extraction
from .test_resume import extract_command

ROWS = 40


def test_a_replacement_host_finishes_a_killed_shard_without_redoing_rows(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"), chunked_prefill_size=128)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=ROWS, vocab_size=1024, seed=11, max_len=400)
    shard0 = run_extraction(server.url, dataset, tmp_path / "host-a" / "out", shard_index=0, num_shards=2, max_seq_len=256)
    assert shard0.status == "complete"

    # Host B runs shard 1 and is killed (SIGKILL: the container is gone) after some rows.
    lost = tmp_path / "host-b" / "out"
    shard_flags = ["--shard-index", "1", "--num-shards", "2"]
    process = subprocess.Popen([*extract_command(server.url, dataset, lost), *shard_flags], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = lost / "samples.jsonl"
        if listed.exists() and len(listed.read_text().splitlines()) >= 5:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()

    # Its output, as fetched earlier (make merge's gather) or read from the shared filesystem, lands on host C.
    taken = tmp_path / "host-c" / "out"
    shutil.copytree(lost, taken)
    manifest = Manifest(taken)
    finished = dict(manifest.written)
    manifest.close()
    assert 5 <= len(finished) < ROWS // 2, f"the kill came too late to test anything ({len(finished)} rows written)"
    before = {row: (taken / s.file).stat().st_mtime_ns for row, s in finished.items()}

    done = subprocess.run(
        [*extract_command(server.url, dataset, taken), *shard_flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    config = json.loads((taken / "data_config.json").read_text())
    assert config["status"] == "complete" and config["total_samples"] == ROWS // 2
    assert f"written now {ROWS // 2 - len(finished)}, already done {len(finished)}" in done.stdout
    assert {row: (taken / s.file).stat().st_mtime_ns for row, s in finished.items()} == before  # not rewritten

    merged = tmp_path / "merged"
    summary = merge_outputs([tmp_path / "host-a" / "out", taken], merged)
    assert summary.samples == ROWS
    assert verify_output(merged).ok
