"""bench/bench_fresh_memory.py at toy sizes: both arms run for each process count, in alternating order, and the
result gives their ratio and the kernel's page reporting settings. Speed is not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the package importable, as `make bench` runs the script
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "extractor"), os.environ.get("PYTHONPATH")]))}


def test_both_arms_run_for_each_process_count_and_leave_nothing_behind(tmp_path: Path) -> None:
    out, work = tmp_path / "results-fresh-memory.json", tmp_path / "work"
    work.mkdir()
    command = [sys.executable, str(REPO / "bench" / "bench_fresh_memory.py"), "--out", str(out), "--dir", str(work),
               "--processes", "1,2", "--file-mb", "2", "--gb-per-process", "0.008", "--repeats", "2", "--rest-s", "0"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert sorted(result["by_processes"]) == ["1", "2"]
    for arms in result["runs_gb_per_s"].values():
        assert len(arms["rested"]) == len(arms["reused"]) == 2 and all(rate > 0 for rate in arms["rested"] + arms["reused"])
    one = result["by_processes"]["1"]
    assert one["rested_over_reused"] == one["rested_gb_per_s"] / one["reused_gb_per_s"]
    assert "page_reporting" in result["hardware"]  # None where the kernel has none
    assert "tmpfs_mount" in result["hardware"]  # None where --dir is not on a tmpfs
    assert list(work.iterdir()) == []  # every file it wrote is gone


def test_a_folder_too_small_for_the_rested_arm_stops_before_any_write(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "bench" / "bench_fresh_memory.py"), "--out", str(tmp_path / "r.json"),
               "--dir", str(tmp_path), "--gb-per-process", "100000"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode != 0 and "lower --gb-per-process" in done.stderr
    assert not (tmp_path / "r.json").exists()
