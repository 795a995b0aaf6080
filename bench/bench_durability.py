"""What the power-loss syncs cost (issue 36): ``Extraction.run()`` with its fsyncs against the same run with
every fsync a no-op (``hsextract.api.syncs_off``), on the filesystem of --work-dir (fsync on tmpfs is free).

Two shapes, each against its own ``hsextract serve`` subprocess on the CPU (start-up not timed):

- ``short_rows``: many short rows of a narrow model, so the extractor writes hundreds of small files a
  second: where a sync per row would cost the most against the row's own work;
- ``wide_rows``: fewer, longer rows of a wider model, megabytes a row: where a sync waits for the data to
  reach the disk instead of leaving it in the page cache.

The two runs alternate by repeat (the order too), each into a fresh output that is removed after it; the
ratio is the unsynced run's wall time over the synced one's (rate synced / rate unsynced), per pair and its
median (on a shared machine single pairs spread by +-20 %: hence many short pairs). Target: >= 0.97 (a sync
cost under 3 % of the run's rate). Beside it, unmoved by the machine's drift: ``row_path_sync_share``, the
seconds the workers waited for their samples' fsyncs (the ``sync`` stage of ``hsextract_stage_seconds``) over
all the seconds of their stages; the folders and the records are synced by a thread of their own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import bench_gpu_e2e as e2e
import transformers

from hsextract.api import ExtractConfig, Extraction, ExtractMetrics, syncs_off
from hsextract.dev.sample_data import make_sample_data
from hsextract.dev.tiny_model import make_tiny_model

log = logging.getLogger("bench_durability")
TARGET = 0.97
VOCAB = 1024
#: name: (model layers, hidden, rows, longest row, concurrency). The server forwards one request at a time
#: (--max-batch-tokens 1): how requests arrive over HTTP decides how a batching server groups them, and the
#: forward's cost would then differ between the two runs by more than the syncs do (pairs 0.73-1.44 at 32).
SHAPES = {"short_rows": (8, 64, 600, 160, 8), "wide_rows": (8, 256, 48, 1024, 8)}


def _extract(url: str, data: Path, output: Path, concurrency: int, rows: int) -> tuple[float, dict[str, float]]:
    """The run's wall seconds and its workers' seconds per stage (summed over rows)."""
    config = ExtractConfig.model_validate(
        {"server": url, "dataset": data, "output": output, "concurrency": concurrency, "log_interval_s": 3600.0}
    )
    metrics = ExtractMetrics()
    started = time.perf_counter()
    summary = Extraction(config, metrics=metrics).run()
    elapsed = time.perf_counter() - started
    if summary.status != "complete" or summary.written_now != rows:
        raise RuntimeError(f"extraction ended {summary.status} with {summary.written_now}/{rows} rows written")
    return elapsed, metrics.stage_totals()


def bench_shape(work: Path, name: str, repeats: int) -> dict[str, Any]:
    layers, hidden, rows, max_len, concurrency = SHAPES[name]
    model = make_tiny_model(work / "model", "llama", layers, hidden, VOCAB, dtype="float32")
    data = make_sample_data(work / "data.jsonl", rows, VOCAB, max_len=max_len)
    dump_dir = Path(tempfile.mkdtemp(prefix="hsx-bench-sync-dumps-", dir="/dev/shm"))
    log_path = work / "server.log"
    server, url = e2e.start_server(model, dump_dir, e2e.serve_args("cpu", max_batch_tokens=1), log_path)
    seconds: dict[str, list[float]] = {"synced": [], "unsynced": []}
    sync_shares: list[float] = []  # of the synced runs: the row path's fsync seconds over all its stages' seconds
    written = 0
    try:
        e2e.wait_healthy(url, server, log_path, 300.0)
        _extract(url, data, work / "warmup", concurrency, rows)  # the server's first batches, page cache
        written = sum(p.stat().st_size for p in (work / "warmup").rglob("*") if p.is_file())
        shutil.rmtree(work / "warmup")
        for repeat in range(repeats):
            for arm in ("synced", "unsynced") if repeat % 2 == 0 else ("unsynced", "synced"):
                output = work / f"{arm}-{repeat}"
                os.sync()  # neither arm pays for the other's writeback
                with syncs_off() if arm == "unsynced" else nullcontext():
                    elapsed, stages = _extract(url, data, output, concurrency, rows)
                seconds[arm].append(elapsed)
                if arm == "synced":
                    sync_shares.append(stages["sync"] / sum(stages.values()))
                shutil.rmtree(output)
            log.info("%s repeat %d: synced %.2f s, unsynced %.2f s", name, repeat, seconds["synced"][-1],
                     seconds["unsynced"][-1])  # fmt: skip
    finally:
        e2e.stop_server(server)
        shutil.rmtree(dump_dir, ignore_errors=True)
    pairs = [u / s for s, u in zip(seconds["synced"], seconds["unsynced"], strict=True)]
    return {
        "synced_vs_unsynced_rate_ratio": statistics.median(pairs),
        "pair_ratios": pairs,
        "synced_rows_per_s": rows / statistics.median(seconds["synced"]),
        "unsynced_rows_per_s": rows / statistics.median(seconds["unsynced"]),
        # noise-free beside the ratio: the share of a row's time spent waiting for its file's fsync
        "row_path_sync_share": statistics.median(sync_shares),
        "output_bytes": written,
        "seconds": seconds,
        "shape": dict(model_layers=layers, model_hidden=hidden, rows=rows, longest_row=max_len, concurrency=concurrency),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-durability.json"), help="JSON result file (default: %(default)s)")
    add("--work-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="scratch parent on the disk under "
        "test (not tmpfs: an fsync there costs nothing); a per-run subdirectory is made in it and removed "
        "(default: bench/work)")  # fmt: skip
    add("--repeats", type=int, default=9, help="synced and unsynced runs of each shape (default: %(default)s)")
    add("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES), help="default: all")
    return parser.parse_args()


def main() -> int:
    e2e.setup_logging("httpx", "httpcore", "hsextract", "transformers")
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    args = parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-durability-", dir=args.work_dir))
    result: dict[str, Any] = {}
    try:
        for name in args.shapes:
            result[name] = bench_shape(work / name, name, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["target"] = TARGET
    result["met"] = {name: result[name]["synced_vs_unsynced_rate_ratio"] >= TARGET for name in args.shapes}
    filesystem = subprocess.run(["df", "-T", str(args.work_dir)], capture_output=True, text=True).stdout.splitlines()[-1:]
    result["machine"] = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "work_dir_filesystem": filesystem}
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in args.shapes:
        figures = result[name]
        pairs = ", ".join(f"{r:.3f}" for r in figures["pair_ratios"])
        print(f"{name:10s} synced vs unsynced {figures['synced_vs_unsynced_rate_ratio']:.3f} (target >= {TARGET}: "
              f"{'met' if result['met'][name] else 'MISSED'}); {figures['synced_rows_per_s']:.0f} rows/s synced, "
              f"{figures['unsynced_rows_per_s']:.0f} unsynced; pairs {pairs}; the row path's fsync share "
              f"{figures['row_path_sync_share']:.3f}")  # fmt: skip
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
