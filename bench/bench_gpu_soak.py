"""GPU soak: back-to-back end-to-end runs, counting stalls (issue 16).

The 8B-shaped model and the dataset of ``bench_gpu_e2e.py`` (same flags), one ``hsextract serve
--device cuda`` per ``--max-batch-tokens`` value (started under ``faulthandler``), then ``--runs``
extractions of all rows each at ``--concurrency`` (default 256) into a fresh output on the local
disk, back to back, once per ``--formats`` entry. Per run it records tokens/s, the longest time any row's complete dump waited
before the extractor took it up (``longest_dump_pickup_s``: from the dump's ``done`` marker),
late answers (rows written before their HTTP answer came), watchdog resends, and whether the run
stalled: no row settled for ``--stall-s`` seconds. A stalled run is stopped after every thread's
stack of both processes is written next to the result (SIGUSR1 to the server, ``faulthandler`` in
this process). Every run has the CLI's defaults, the spot check on: a run that does not end
``complete`` with every token (a stop, a stall) is a failed run, and the script exits 1 if any run
failed. The result JSON is rewritten after every run; ``--append`` adds to an existing one (the soak
can be split over several calls, one per budget).

Before its extractions each server also regenerates (``--regenerate-runs`` runs, 0: none): ``hsextract
regenerate`` at the CLI's defaults (the server's: the static decode cache, the step replayed as a CUDA
graph) over ``--regenerate-rows`` multi-turn conversations, each turn up to ``--regenerate-new-tokens``,
into a fresh output. A run fails when it does not end complete with every row ok or when it passes
``--regenerate-timeout-s`` (the stacks of both processes are taken); each run's answers are compared
with the first run's (``same_as_first_run``: the share of conversations regenerated identically; greedy
decoding of a batch whose composition differs may differ in bf16, so this is reported, not held).
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
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
from hsextract.dev.sample_data import make_sample_conversations
from hsextract.dev.tokenizer import write_tokenizer

log = logging.getLogger("bench_gpu_soak")

#: ``python -c`` of the hsextract CLI with every thread's stack written to stderr on SIGUSR1
CLI_WITH_STACKS = (
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "from hsextract.cli import main; sys.exit(main(sys.argv[1:]))"
)


def start_server(model_dir: Path, dump_dir: Path, args: argparse.Namespace, budget: int, log_path: Path) -> tuple[Any, str]:
    """``hsextract serve`` with every thread's stack on SIGUSR1."""
    port = e2e.free_port()
    command = [
        sys.executable, "-c", CLI_WITH_STACKS, "serve", "--model", str(model_dir), "--dump-dir", str(dump_dir),
        "--port", str(port), "--device", args.device, "--max-batch-tokens", str(budget),
        "--chunked-prefill-size", str(args.chunked_prefill_size),
    ]  # fmt: skip
    if args.layer_ids:
        command += ["--layer-ids", args.layer_ids]
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}"


def regenerate_run(
    url: str, conversations: Path, output: Path, args: argparse.Namespace, log_path: Path, server: Any
) -> dict[str, Any]:
    """One ``hsextract regenerate`` at the CLI's defaults, in a child process: on a timeout the stacks of both
    processes go to their logs (``log_path`` and the server's)."""
    command = [sys.executable, "-c", CLI_WITH_STACKS, "regenerate", "--server", url, "--dataset", str(conversations),
               "--output", str(output), "--max-new-tokens", str(args.regenerate_new_tokens), "--no-progress"]  # fmt: skip
    started = time.perf_counter()
    with open(log_path, "wb") as child_log:
        child = subprocess.Popen(command, stdout=child_log, stderr=subprocess.STDOUT)
        try:
            code: int | None = child.wait(args.regenerate_timeout_s)
        except subprocess.TimeoutExpired:
            log.error("regeneration still running after %.0f s; taking stacks", args.regenerate_timeout_s)
            child.send_signal(signal.SIGUSR1)
            server.send_signal(signal.SIGUSR1)
            time.sleep(2)
            child.kill()
            child.wait()
            code = None
    seconds = time.perf_counter() - started
    # OUTPUT.journal/summary.json, written last by a complete run (the CLI's --output help names the folder)
    counts = json.loads((output.parent / f"{output.name}.journal" / "summary.json").read_text())["counts"] if code == 0 else {}
    return {
        "exit_code": code,
        "failed": code != 0 or counts.get("ok") != args.regenerate_rows,
        "rows_ok": counts.get("ok"),
        "turns": counts.get("turns_regenerated"),
        "generated_tokens": counts.get("generated_tokens"),
        "truncated_turns": counts.get("truncated_turns"),
        "seconds": round(seconds, 2),
        "generated_tokens_per_s": round(counts["generated_tokens"] / seconds, 1) if counts.get("generated_tokens") else None,
    }


def regenerate(url: str, work: Path, args: argparse.Namespace, budget: int, server: Any) -> list[dict[str, Any]]:
    """``--regenerate-runs`` regenerations of the same conversations by one server, each compared with the first."""
    records: list[dict[str, Any]] = []
    first: list[str] | None = None
    for run in range(1, args.regenerate_runs + 1):
        output = work / f"regen-{budget}-{run}.jsonl"
        log_path = args.out.with_name(f"{args.out.stem}-regen-{budget}-{run}.log")
        record = {
            "max_batch_tokens": budget,
            "run": run,
            **regenerate_run(url, work / "conversations.jsonl", output, args, log_path, server),
        }
        if output.exists():
            answers = output.read_text().splitlines()
            first = answers if first is None else first
            record["same_as_first_run"] = round(sum(a == b for a, b in zip(answers, first, strict=False)) / max(1, len(first)), 4)
        log.info("regeneration %s", record)
        records.append(record)
        if record["failed"]:
            break
    return records


def one_run(
    url: str, data: Path, output: Path, args: argparse.Namespace, tokens: int, stacks: Path, server: Any, output_format: str
) -> dict[str, Any]:
    metrics = ExtractMetrics()
    config = ExtractConfig.model_validate(
        {"server": url, "dataset": data, "output": output, "max_seq_len": args.max_seq_len, "concurrency": args.concurrency,
         "log_interval_s": 30.0, "format": output_format}
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
    add("--formats", default="specforge", help="comma-separated extractor --format values: each run extracts once per "
        "format, one after the other (speculators asks the embedded server for stacked dumps in the model's dtype)")
    add("--stall-s", type=float, default=60.0, help="no row settled this long: the run counts as stalled")
    add("--append", action="store_true", help="add to the runs already in --out")
    add("--regenerate-runs", type=int, default=2, help="hsextract regenerate runs per server, before its extractions (0: none)")
    add("--regenerate-rows", type=int, default=512, help="conversations each regeneration run regenerates")
    add("--regenerate-new-tokens", type=int, default=128, help="regeneration's --max-new-tokens")
    add("--regenerate-timeout-s", type=float, default=300.0, help="a regeneration run still going after this fails")
    e2e.add_workload_args(parser)
    add("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script, measures nothing")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.max_seq_len, args.budgets = 64, 60, 300, 200, "512,1024"
        args.chunked_prefill_size, args.concurrency, args.runs = 128, 16, 2
        args.regenerate_rows, args.regenerate_new_tokens = 16, 8
    return e2e.finish_args(args)


def main() -> int:
    e2e.setup_logging("httpx", "httpcore", "transformers", "hsextract")
    args = parse_args()
    e2e.SAMPLER = e2e.GpuSampler()
    results = e2e.Results(args.out)
    previous = json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    runs: list[dict[str, Any]] = previous.get("runs", [])
    regenerations: list[dict[str, Any]] = previous.get("regenerations", [])
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    tmpfs = Path(tempfile.mkdtemp(prefix="hsx-soak-", dir=args.tmpfs_dir))
    disk = Path(tempfile.mkdtemp(prefix="hsx-soak-", dir=args.disk_dir))
    config = e2e.config_json(args)
    results.update(hardware=e2e.hardware(args), config=config)
    try:
        e2e.make_model(tmpfs / "model", args, torch.device(args.device))
        write_tokenizer(tmpfs / "model", "llama3", args.vocab)  # regeneration renders its prompts with it
        make_sample_conversations(tmpfs / "conversations.jsonl", num=args.regenerate_rows, style="messages")
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
                regenerations += regenerate(url, tmpfs, args, budget, server)
                results.update(regenerations=regenerations, summary=summarize(runs, regenerations))
                for run, output_format in itertools.product(range(1, args.runs + 1), args.formats.split(",")):
                    stacks = args.out.with_name(f"{args.out.stem}-stacks-{budget}-{run}-{output_format}.txt")
                    record = {"max_batch_tokens": budget, "run": run, "format": output_format}
                    # the CLI's defaults
                    record.update(one_run(url, data, disk / "out", args, tokens, stacks, server, output_format))
                    runs.append(record)
                    log.info("%s", record)
                    shutil.rmtree(disk / "out", ignore_errors=True)
                    results.update(runs=runs, summary=summarize(runs, regenerations))
                    if record["stalls"]:
                        break  # the stacks are taken; a stalled server is not measured further
            finally:
                e2e.stop_server(server)
        summary = summarize(runs, regenerations)
        print(json.dumps(summary, indent=1))
    finally:
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    if summary["failed_runs"] or summary["failed_regenerations"]:
        log.error("%d of %d runs did not end complete (a stop, e.g. the spot check's, or a stall), %d of %d regenerations "
                  "did not end complete with every row ok: the soak fails", summary["failed_runs"], summary["runs"],
                  summary["failed_regenerations"], summary["regenerations"])  # fmt: skip
        return 1
    return 0


def summarize(runs: list[dict[str, Any]], regenerations: list[dict[str, Any]]) -> dict[str, Any]:
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
    by_format: dict[str, Any] = {}
    for output_format in sorted({r.get("format", "specforge") for r in runs}):
        rates = [r["tokens_per_s"] for r in runs if r.get("format", "specforge") == output_format]
        by_format[output_format] = {"runs": len(rates), "tokens_per_s_median": statistics.median(rates)}
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
        "by_format": by_format,
        "regenerations": len(regenerations),
        "failed_regenerations": sum(r["failed"] for r in regenerations),
        "regeneration_generated_tokens_per_s": [r["generated_tokens_per_s"] for r in regenerations],
        "regeneration_same_as_first_run_min": min(
            (r["same_as_first_run"] for r in regenerations if "same_as_first_run" in r), default=None
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
