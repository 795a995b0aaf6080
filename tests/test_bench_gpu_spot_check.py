"""bench/bench_gpu_spot_check.py --cpu-smoke: a second call with --append keeps the first call's figures of the same
model (one such call replaced the 8B model's fault runs with a later server-only run). Speed is not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_append_keeps_an_earlier_run_of_the_same_model(tmp_path: Path) -> None:
    out = tmp_path / "results-gpu-spot-check.json"
    path = [str(REPO / "extractor"), str(REPO / "bench"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    command = [sys.executable, str(REPO / "bench" / "bench_gpu_spot_check.py"), "--cpu-smoke", "--models", "8b",
               "--phases", "server", "--repeats", "1", "--out", str(out),
               "--work", str(tmp_path / "work")]  # fmt: skip
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-4000:]
    measured = json.loads(out.read_text())["models"]["8b"]

    second = subprocess.run([*command, "--append"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-4000:]
    models = json.loads(out.read_text())["models"]
    assert set(models) == {"8b", "8b-2"}
    assert models["8b"] == measured  # the first call's figures, untouched
    assert [run["name"] for run in models["8b-2"]["runs"]][:3] == ["off", "default_bf16", "default_fp8"]
    assert "8b is already in --out: this run is recorded as 8b-2" in second.stderr
