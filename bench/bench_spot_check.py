"""What the spot check costs: one run's rate with and without the default ``--spot-check-every``.

An ``hsextract serve`` subprocess on CPU (a tiny deepseek_v3 model, float32 by default) serves
``Extraction.run()`` in-process over the same dataset, alternately with ``spot_check_every 0`` and with
the default (``hsextract.contract.defaults.SPOT_CHECK_EVERY``), ``--repeats`` times each; medians of
samples/s are reported and their ratio (``spot_check_vs_off_rate_ratio``: 1.0 is free, the target is
>= 0.98, i.e. under 2 % of the run). Also the seconds the checked rows spent in the check itself
(``hsextract_stage_seconds{stage="spot_check"}``) against the run's seconds, and how many rows were
checked and matched. Writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import transformers
from bench_core import VOCAB, _free_port, _wait_healthy
from bench_gpu_e2e import stop_server

from hsextract.api import ExtractConfig, Extraction, ExtractMetrics
from hsextract.contract import defaults
from hsextract.dev.sample_data import make_sample_data
from hsextract.dev.tiny_model import make_tiny_model

log = logging.getLogger("bench_spot_check")
TARGET = 0.98  # the spot check at its default costs under 2 % of the run


def one_run(url: str, data: Path, output: Path, args: argparse.Namespace, every: int) -> dict[str, float]:
    fields = {"server": url, "dataset": data, "output": output, "concurrency": args.concurrency, "log_interval_s": 3600.0}
    config = ExtractConfig.model_validate({**fields, "spot_check_every": every})
    metrics = ExtractMetrics()
    started = time.perf_counter()
    summary = Extraction(config, metrics=metrics).run()
    seconds = time.perf_counter() - started
    if summary.status != "complete":
        raise RuntimeError(f"extraction (spot_check_every {every}) ended {summary.status}: {summary.fatal_error}")
    checks = json.loads((output / "data_config.json").read_text())["spot_checks"]
    return {
        "seconds": seconds,
        "samples_per_s": summary.written_now / seconds,
        "spot_check_seconds": metrics.stage_totals()["spot_check"],
        "checked_rows": checks["checked_rows"],
        "matched_rows": checks["matched_rows"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-spot-check.json"), help="JSON result file (default: %(default)s)")
    add("--rows", type=int, default=1000, help="dataset rows (default: %(default)s)")
    add("--max-len", type=int, default=600, help="longest row in tokens (default: %(default)s)")
    add("--every", type=int, default=defaults.SPOT_CHECK_EVERY, help="the spot check measured (default: %(default)s)")
    add("--repeats", type=int, default=3, help="runs with and without, alternating (default: %(default)s)")
    add("--concurrency", type=int, default=8, help="requests in flight (default: %(default)s)")
    add("--model-hidden", type=int, default=256, help="tiny deepseek_v3 model's hidden size (default: %(default)s)")
    add("--model-layers", type=int, default=8, help="tiny model's layers (default: %(default)s)")
    add("--model-dtype", choices=["bfloat16", "float32"], default="float32", help="(default: %(default)s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "hsextract", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    work = Path(tempfile.mkdtemp(prefix="bench-spot-check-"))
    dump_dir = Path(tempfile.mkdtemp(prefix="hsx-bench-spot-", dir="/dev/shm"))
    model = make_tiny_model(work / "model", "deepseek_v3", args.model_layers, args.model_hidden, VOCAB, dtype=args.model_dtype)
    data = make_sample_data(work / "data.jsonl", args.rows, VOCAB, max_len=args.max_len)
    port, log_path = _free_port(), work / "server.log"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "hsextract", "serve", "--model", str(model), "--dump-dir", str(dump_dir),
               "--port", str(port)]  # fmt: skip
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        _wait_healthy(url, server, 300.0, log_path)
        for repeat in range(args.repeats):  # alternating: drift on a shared machine hits both alike
            for name in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
                every = 0 if name == "off" else args.every
                runs[name].append(one_run(url, data, work / f"out-{name}-{repeat}", args, every))
                log.info("repeat %d, spot check %s: %.2f samples/s", repeat, name, runs[name][-1]["samples_per_s"])
    finally:
        stop_server(server)
        shutil.rmtree(dump_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    rate = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
    on = runs["on"]
    result: dict[str, Any] = {
        "spot_check_every": args.every,
        "spot_check_vs_off_rate_ratio": rate["on"] / rate["off"],
        "samples_per_s": rate,
        "spot_check_vs_off_rate_ratio_per_repeat": [
            a["samples_per_s"] / b["samples_per_s"] for a, b in zip(on, runs["off"], strict=True)
        ],
        "spot_check_seconds_share": statistics.median(r["spot_check_seconds"] / r["seconds"] for r in on),
        "checked_rows_per_run": [r["checked_rows"] for r in on],
        "matched_rows_per_run": [r["matched_rows"] for r in on],
        "rows": args.rows,
        "concurrency": args.concurrency,
        "model": {"arch": "deepseek_v3", "hidden": args.model_hidden, "layers": args.model_layers, "dtype": args.model_dtype},
        "target": TARGET,
        "met": rate["on"] / rate["off"] >= TARGET,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"spot check     every {args.every}: {rate['on']:.2f} samples/s vs {rate['off']:.2f} off, ratio "
        f"{result['spot_check_vs_off_rate_ratio']:.3f} (target >= {TARGET}: {'met' if result['met'] else 'MISSED'}); "
        f"{statistics.median(result['checked_rows_per_run']):.0f} rows checked per run, "
        f"check time {result['spot_check_seconds_share']:.2%} of the run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
