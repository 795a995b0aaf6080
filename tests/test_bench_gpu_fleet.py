"""bench/bench_gpu_fleet.py --cpu-smoke: two toy servers on the CPU, one extractor process per shard, then
hsextract merge and verify; the result JSON says the merged output is whole (issue 21). Speed is not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_cpu_smoke_merges_two_shards_into_a_verified_output(tmp_path: Path) -> None:
    out = tmp_path / "results-gpu-fleet.json"
    path = [str(REPO / "extractor"), str(REPO / "bench"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    command = [sys.executable, str(REPO / "bench" / "bench_gpu_fleet.py"), "--cpu-smoke", "--out", str(out)]
    # one variant: FP8 in speculators' layout, the one with more to merge (the Arrow dataset, token_freq.pt, the
    # scales); both formats' merges are tests/test_merge.py's
    command += ["--disk-dir", str(tmp_path / "disk"), "--tmpfs-dir", str(tmp_path), "--variants", "fp8"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]

    result = json.loads(out.read_text())
    assert result["gpus"] == 2 and result["hardware"]["gpus_used"] == 2
    rows, bad = result["config"]["rows"], result["dataset"]["bad_rows"]
    assert rows == 20 and len(bad) == 2
    assert set(result["phases"]) == {"fp8"}
    for variant in ("fp8",):
        phases = result["phases"][variant]
        merged = phases["merged"]
        assert merged["merge"]["rc"] == 0 and merged["verify"]["rc"] == 0, merged
        assert merged["ok"] and all(merged["checks"].values()), merged["checks"]
        assert merged["shards"] == 2
        assert merged["total_samples"] + merged["bad_input_samples"] + merged["failed_samples"] == rows
        assert merged["bad_input_samples"] == len(bad) and merged["failed_samples"] == 0

        fleet, single = phases["fleet"], phases["single"]
        assert fleet["extractors"] == 2 and [e["shard"] for e in fleet["extractor"]] == [[0, 2], [1, 2]]
        assert fleet["samples"] == rows - len(bad) and fleet["tokens"] == merged["total_tokens"]
        assert sum(e["rows_in_shard"] for e in fleet["extractor"]) == rows
        assert single["extractors"] == 1 and single["extractor"][0]["shard"] == [0, 2]  # GPU 0's share
        for extractor in fleet["extractor"] + single["extractor"]:
            # stage seconds scraped from the finished extractor: every written sample went through each stage
            # (and the spot check of the shard's first row)
            stages = {"request", "wait_dump", "turn", "read", "verify", "pack", "sync", "spot_check"}
            assert set(extractor["stage_seconds_sum"]) == stages
            assert extractor["stage_counts"]["pack"] == extractor["samples"]
            assert extractor["tokens_counted"] == extractor["tokens"]
        assert len(fleet["server"]) == 2 and all(s["dumps"] for s in fleet["server"])
        assert fleet["host_cpu"]["source"] != "/proc/stat" or 0 < fleet["host_cpu"]["busy_fraction"] <= 1
        assert phases["disk_write"]["tokens_per_s"] > 0

        headline = result["by_variant"][variant]
        assert headline["merged_ok"] is True
        assert headline["n_x_single_tokens_per_s"] == 2 * headline["single_tokens_per_s"]
        assert headline["fleet_vs_limit_ratio"] == headline["fleet_tokens_per_s"] / headline["limit_tokens_per_s"]
