"""GPU soak: back-to-back end-to-end runs, counting stalls (issue 16).

The 8B-shaped model and the dataset of ``bench_gpu_e2e.py`` (same flags), one ``hsextract serve
--device cuda`` per ``--max-batch-tokens`` value (started under ``faulthandler``), then ``--runs``
extractions of all rows each at ``--concurrency`` (default 256) into a fresh output on the local
disk, back to back. Per run it records tokens/s, the longest time any row's complete dump waited
before the extractor took it up (``longest_dump_pickup_s``: from the dump's ``done`` marker),
late answers (rows written before their HTTP answer came), watchdog resends, and whether the run
stalled: no row settled for ``--stall-s`` seconds. A stalled run is stopped after every thread's
stack of both processes is written next to the result (SIGUSR1 to the server, ``faulthandler`` in
this process). Every run has the CLI's defaults, the spot check on: a run that does not end
``complete`` with every token (a stop, a stall) is a failed run, and the script exits 1 if any run
failed. The result JSON is rewritten after every run; ``--append`` adds to an existing one (the soak
can be split over several calls, one per budget).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_gpu_e2e as e2e
import torch

from hsextract.api import ExtractConfig, Extraction, ExtractMetrics

log = logging.getLogger("bench_gpu_soak")


def start_server(model_dir: Path, dump_dir: Path, args: argparse.Namespace, budget: int, log_path: Path) -> tuple[Any, str]:
    """``hsextract serve`` with every thread's stack on SIGUSR1."""
    port = e2e.free_port()
    wrapper = (
        "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
        "from hsextract.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    command = [
        sys.executable, "-c", wrapper, "serve", "--model", str(model_dir), "--dump-dir", str(dump_dir), "--port", str(port),
        "--device", args.device, "--max-batch-tokens", str(budget), "--chunked-prefill-size", str(args.chunked_prefill_size),
    ]  # fmt: skip
    if args.layer_ids:
        command += ["--layer-ids", args.layer_ids]
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}"


def one_run(
    url: str, data: Path, output: Path, args: argparse.Namespace, tokens: int, stacks: Path, server: Any
) -> dict[str, Any]:
    metrics = ExtractMetrics()
    config = ExtractConfig.model_validate(
        {"server": url, "dataset": data, "output": output, "max_seq_len": args.max_seq_len, "concurrency": args.concurrency,
         "log_interval_s": 30.0}
    )  # fmt: skip
    extraction = Extraction(config, metrics=metrics)
    stalled: list[float] = []
    finished = threading.Event()

    def watch() -> None:
        last, since = -1.0, time.monotonic()
        while not finished.wait(1.0):
            settled = metrics.registry.get_sample_value("hsextract_samples_total", {"status": "ok"}) or 0.0
            if settled != last:
                last, since = settled, time.monotonic()
            elif time.monotonic() - since >= args.stall_s:
                stalled.append(settled)
                log.error("stall: no row settled for %.0f s at %d rows; taking stacks", args.stall_s, settled)
                with open(stacks, "w") as handle:
                    faulthandler.dump_traceback(file=handle, all_threads=True)
                server.send_signal(signal.SIGUSR1)
                time.sleep(2)
                extraction.request_stop("soak stall")
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    try:
        summary = extraction.run()
    finally:
        finished.set()
    seconds = time.perf_counter() - started
    value = metrics.registry.get_sample_value
    spot = json.loads((output / "data_config.json").read_text()).get("spot_checks") or {}
    return {
        "status": str(summary.status),
        # a run that did not end complete with every token (stopped, incomplete, a stall) fails the soak
        "failed": summary.status != "complete" or summary.total_tokens != tokens or bool(stalled),
        "fatal_error": summary.fatal_error,
        "spot_checks": {k: spot.get(k) for k in ("every", "checked_rows", "mismatched_rows", "failed_requests")},
        "samples": summary.total_samples,
        "tokens": summary.total_tokens,
        "complete": summary.total_tokens == tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(summary.total_tokens / seconds, 1),
        "longest_dump_pickup_s": round(summary.longest_dump_pickup_s, 4),
        "late_answers": summary.late_answers,
        "watchdog_resends": int(value("hsextract_watchdog_resends_total") or 0),
        "retries": int(value("hsextract_retries_total") or 0),
        "stalls": len(stalled),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-gpu-soak.json"))
    add("--disk-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="the runs' output (local disk)")
    add("--tmpfs-dir", type=Path, default=Path("/dev/shm"), help="model, data and dumps")
    add("--runs", type=int, default=5, help="back-to-back runs per budget")
    add("--budgets", default="8192,16384", help="comma-separated --max-batch-tokens values, one server each")
    add("--stall-s", type=float, default=60.0, help="no row settled this long: the run counts as stalled")
    add("--append", action="store_true", help="add to the runs already in --out")
    e2e.add_workload_args(parser)
    add("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script, measures nothing")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.max_seq_len, args.budgets = 64, 60, 300, 200, "512,1024"
        args.chunked_prefill_size, args.concurrency, args.runs = 128, 16, 2
    return e2e.finish_args(args)


def main() -> int:
    e2e.setup_logging("httpx", "httpcore", "transformers", "hsextract")
    args = parse_args()
    e2e.SAMPLER = e2e.GpuSampler()
    results = e2e.Results(args.out)
    runs: list[dict[str, Any]] = json.loads(args.out.read_text()).get("runs", []) if args.append and args.out.exists() else []
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    tmpfs = Path(tempfile.mkdtemp(prefix="hsx-soak-", dir=args.tmpfs_dir))
    disk = Path(tempfile.mkdtemp(prefix="hsx-soak-", dir=args.disk_dir))
    config = e2e.config_json(args)
    results.update(hardware=e2e.hardware(args), config=config)
    try:
        e2e.make_model(tmpfs / "model", args, torch.device(args.device))
        if args.device == "cuda":
            torch.cuda.empty_cache()
        data = tmpfs / "data.jsonl"
        dataset = e2e.make_dataset(data, args)
        tokens = dataset["tokens"]
        results.update(dataset={k: v for k, v in dataset.items() if k != "lengths_truncated"})
        for budget in (int(b) for b in args.budgets.split(",")):
            server_log = args.out.with_name(f"{args.out.stem}-server-{budget}.log")
            server, url = start_server(tmpfs / "model", tmpfs / f"dumps-{budget}", args, budget, server_log)
            try:
                e2e.wait_healthy(url, server, server_log)
                for run in range(1, args.runs + 1):
                    stacks = args.out.with_name(f"{args.out.stem}-stacks-{budget}-{run}.txt")
                    record = {"max_batch_tokens": budget, "run": run}
                    record.update(one_run(url, data, disk / "out", args, tokens, stacks, server))  # the CLI's defaults
                    runs.append(record)
                    log.info("%s", record)
                    shutil.rmtree(disk / "out", ignore_errors=True)
                    results.update(runs=runs, summary=summarize(runs))
                    if record["stalls"]:
                        break  # the stacks are taken; a stalled server is not measured further
            finally:
                e2e.stop_server(server)
        summary = summarize(runs)
        print(json.dumps(summary, indent=1))
    finally:
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    if summary["failed_runs"]:
        log.error("%d of %d runs did not end complete (a stop, e.g. the spot check's, or a stall): the soak fails",
                  summary["failed_runs"], summary["runs"])  # fmt: skip
        return 1
    return 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_budget: dict[str, Any] = {}
    for budget in sorted({r["max_batch_tokens"] for r in runs}):
        rates = [r["tokens_per_s"] for r in runs if r["max_batch_tokens"] == budget]
        by_budget[str(budget)] = {
            "runs": len(rates),
            "tokens_per_s_median": statistics.median(rates),
            "tokens_per_s_min": min(rates),
            "tokens_per_s_max": max(rates),
            "run_to_run_spread": (max(rates) - min(rates)) / statistics.median(rates),
        }
    return {
        "runs": len(runs),
        "stalls": sum(r["stalls"] for r in runs),
        "incomplete_runs": sum(not r["complete"] for r in runs),
        "failed_runs": sum(r.get("failed", False) for r in runs),
        "spot_check_mismatched_rows": sum((r.get("spot_checks") or {}).get("mismatched_rows") or 0 for r in runs),
        "longest_dump_pickup_s": max((r["longest_dump_pickup_s"] for r in runs), default=None),
        "late_answers": sum(r["late_answers"] for r in runs),
        "watchdog_resends": sum(r["watchdog_resends"] for r in runs),
        "by_max_batch_tokens": by_budget,
    }


if __name__ == "__main__":
    sys.exit(main())
