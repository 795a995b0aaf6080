"""bench/bench_gpu_soak.py --cpu-smoke: the regeneration runs of each server are recorded beside its extractions, a
regeneration that does not end (past --regenerate-timeout-s) fails the soak, and --formats soaks each output format.
Speed is not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def soak(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "results-gpu-soak.json"
    path = [str(REPO / "extractor"), str(REPO / "bench"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    command = [sys.executable, str(REPO / "bench" / "bench_gpu_soak.py"), "--cpu-smoke", "--out", str(out),
               "--disk-dir", str(tmp_path / "disk"), "--tmpfs-dir", str(tmp_path), *extra]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600), out


def test_each_server_regenerates_every_row_before_its_extractions(tmp_path: Path) -> None:
    done, out = soak(tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    regenerations = results["regenerations"]
    assert [(r["max_batch_tokens"], r["run"]) for r in regenerations] == [(512, 1), (512, 2), (1024, 1), (1024, 2)]
    assert all(r["exit_code"] == 0 and not r["failed"] and r["rows_ok"] == 16 for r in regenerations)
    assert all(r["generated_tokens"] > 0 for r in regenerations)
    assert all(0.0 <= r["same_as_first_run"] <= 1.0 for r in regenerations)
    assert results["summary"]["failed_regenerations"] == 0
    assert results["summary"]["failed_runs"] == 0 and len(results["runs"]) == 4


def test_a_regeneration_past_its_timeout_fails_the_soak_with_the_stacks_in_its_log(tmp_path: Path) -> None:
    done, out = soak(tmp_path, "--regenerate-timeout-s", "0.5", "--regenerate-runs", "1")
    assert done.returncode == 1
    results = json.loads(out.read_text())
    assert all(r["failed"] and r["exit_code"] is None for r in results["regenerations"])
    assert results["summary"]["failed_regenerations"] == 2
    assert "the soak fails" in done.stderr
    # faulthandler's stacks: "Thread 0x..." heads only the other threads', and a regeneration stopped while it still
    # imports (a loaded machine, 0.5 s) has none yet; every thread's stack says this, the current one's too
    assert "(most recent call first)" in (tmp_path / "results-gpu-soak-regen-512-1.log").read_text()


def test_each_run_extracts_once_per_format_and_the_summary_counts_each(tmp_path: Path) -> None:
    # speculators asks the embedded server for stacked dumps: the default path of that format, soaked beside SpecForge's
    done, out = soak(tmp_path, "--formats", "specforge,speculators", "--regenerate-runs", "0")
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    runs = [(r["max_batch_tokens"], r["run"], r["format"]) for r in results["runs"]]
    assert runs == [(budget, run, fmt) for budget in (512, 1024) for run in (1, 2) for fmt in ("specforge", "speculators")]
    assert all(r["complete"] and not r["failed"] and r["spot_checks"]["mismatched_rows"] == 0 for r in results["runs"])
    by_format = results["summary"]["by_format"]
    assert sorted(by_format) == ["specforge", "speculators"] and all(f["runs"] == 4 for f in by_format.values())
