"""Does the spot check tell the engine's own noise from a wrong tensor on a GPU? (issue 34)

Per model (``--models``; nothing downloaded, random bf16 weights made on the GPU):

* ``8b``: the 8B-shaped Llama of ``bench_gpu_e2e.py`` (its ``llama_config``: hidden 4096, 32 layers);
* ``kimi``: Kimi-K2.5's shapes in the DeepSeek-V3 architecture: hidden 7168, 64 heads, its MLA ranks
  (q 1536, kv 512, rope 64, nope 128, v 128), a dense first layer and then a mixture of experts routed
  8 of ``--kimi-experts`` with one shared expert, over ``--kimi-layers`` layers (the real model's 61
  layers and 384 experts do not fit one GPU).

For each: ``hsextract serve --device cuda`` (a subprocess, as a user runs it) and ``--rows`` rows of
log-normal lengths at the CLI's concurrency, ``--repeats`` times each, interleaved: the spot check off,
at the CLI's default (the first row and 1 in 200) in bfloat16, and at the default in FP8 (speculators);
then (after the faults) every row checked (``--every-row-rows`` rows, ``--every-row-repeats`` times) in
bfloat16 and FP8. A clean run
must end ``complete`` with no row differing (a false alarm stops a default run). The faults: the same
model in this process as :class:`~hsextract.dev.faulty_engines.FaultyEngine`, one dump-path fault at a
time, with the CLI's defaults and ``spot_check_max_mismatches 1``: each fault must stop the run at the
first checked row. Recorded: per run the status, rate and ``spot_checks``
(per tensor: the worst error of a matching dump, the smallest distance to an alternative); per model the
false alarms, the faults caught, and the default's cost (``default_vs_off_rate_ratio``: median rate with
the default check over the median with it off; ``default_vs_off_pair_ratios``: the same per interleaved
pair; target >= 0.98) and, unmoved by the machine's drift, from the embedded server's stages
(``default_device_cost_target_met``): the checks' spans on the device (``spot_check_forward``, CUDA events on
their own stream) over the run's seconds within 0.02, or else the rows' forwards neither idled
(``rows_stream_busy_share_median``, with the check against without) nor slowed
(``default_vs_off_forward_seconds_per_token``) by more than that. Per run: every server stage's seconds and
count, and the check thread's host time launching the checks (``server_check_host_share``: on a saturated GPU
partly a wait for room in the device's launch queue, as for every batched forward).

``--append`` adds a model's figures to an existing result file (one model per device call), replacing
that model's; ``--phases server`` leaves the faults out; ``--phases faults`` runs only the faults and then
every row checked on the same in-process engine (for a call too short to start a server too);
``--deadline-s`` starts no phase past that many seconds. ``--cpu-smoke`` runs the whole script at toy
sizes on the CPU (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import bench_gpu_e2e as e2e
import httpx
import torch
import transformers

from hsextract.api import ExtractConfig, Extraction, ExtractMetrics, HttpFront, ServeConfig
from hsextract.contract import defaults
from hsextract.dev.faulty_engines import FAULT_NAMES, FaultyEngine

log = logging.getLogger("bench_gpu_spot_check")
TARGET_COST_RATIO = 0.98
FP8 = {"format": "speculators", "storage": "float8_e4m3fn"}
BF16 = {"format": "specforge", "storage": "auto"}


# -- models and data ----------------------------------------------------------------------------------------
def kimi_config(args: argparse.Namespace) -> Any:
    return transformers.DeepseekV3Config(
        vocab_size=args.vocab,
        hidden_size=args.kimi_hidden,
        intermediate_size=args.kimi_dense_intermediate,
        moe_intermediate_size=args.kimi_moe_intermediate,
        num_hidden_layers=args.kimi_layers,
        num_attention_heads=args.kimi_heads,
        num_key_value_heads=args.kimi_heads,
        n_routed_experts=args.kimi_experts,
        num_experts_per_tok=min(8, args.kimi_experts),
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.827,
        q_lora_rank=args.kimi_q_lora,
        kv_lora_rank=args.kimi_kv_lora,
        qk_rope_head_dim=args.kimi_rope,
        qk_nope_head_dim=args.kimi_nope,
        v_head_dim=args.kimi_v,
        max_position_embeddings=8192,
        rope_theta=50000.0,
        tie_word_embeddings=False,
    )


def make_model(directory: Path, config: Any, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(args.device):
            model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    finally:
        torch.set_default_dtype(previous)
    model.config.dtype = "bfloat16"
    started = time.perf_counter()
    model.save_pretrained(str(directory))
    shape = {
        "architecture": type(model).__name__,
        "parameters_b": model.num_parameters() / 1e9,
        "layers": int(config.num_hidden_layers),
        "hidden": int(config.hidden_size),
        "saved_s": time.perf_counter() - started,
    }
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return shape


def make_dataset(path: Path, rows: int, args: argparse.Namespace, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    lengths = [min(args.longest, max(2, round(rng.lognormvariate(math.log(args.median), 0.6)))) for _ in range(rows)]
    with open(path, "w") as handle:
        for length in lengths:
            ids = [rng.randrange(args.vocab) for _ in range(length)]
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [1] * length}) + "\n")
    return {"rows": rows, "tokens": sum(lengths), "median_length": statistics.median(lengths), "longest": max(lengths)}


# -- one extraction -------------------------------------------------------------------------------------------
def extract(url: str, data: Path, output: Path, args: argparse.Namespace, **settings: Any) -> dict[str, Any]:
    """One run with the CLI's defaults plus ``settings``; what the spot check saw, never raising on a stop."""
    shutil.rmtree(output, ignore_errors=True)
    config = ExtractConfig.model_validate(
        {"server": url, "dataset": data, "output": output, "concurrency": args.concurrency, "log_interval_s": 30.0,
         "health_timeout_s": 120, **settings}
    )  # fmt: skip
    before = scrape(url)
    started = time.perf_counter()
    summary = Extraction(config, metrics=ExtractMetrics()).run()
    seconds = time.perf_counter() - started
    stages = stage_deltas(before, scrape(url))
    recorded = json.loads((output / "data_config.json").read_text())
    errors_path = output / "errors.jsonl"
    errors = [json.loads(line) for line in errors_path.read_text().splitlines()] if errors_path.exists() else []
    shutil.rmtree(output, ignore_errors=True)
    return {
        "settings": settings,
        "status": str(summary.status),
        "fatal_error": summary.fatal_error,
        "seconds": seconds,
        "samples": summary.total_samples,
        "tokens": summary.total_tokens,
        "samples_per_s": summary.total_samples / seconds,
        "tokens_per_s": summary.total_tokens / seconds,
        "spot_checks": recorded.get("spot_checks"),
        # the embedded server's stages during the run: {stage: {"seconds": sum, "count": n}}
        "server_stages": stages,
        # the checks' spans on the device over the run's; since the checks run on a stream of their own they
        # overlap the rows' forwards, so this bounds their cost from above
        "server_check_span_share": share(stages, "spot_check_forward", seconds),
        # the check thread's host time launching the checks (on a busy GPU partly a wait for room in the launch queue)
        "server_check_host_share": share(stages, "spot_check", seconds),
        # the rows' forwards: their stream's busy share (a check that left it idle lowers it) and their device time
        # per token (a check that slowed them raises it)
        "rows_stream_busy_share": share(stages, "forward", seconds),
        "forward_seconds_per_token": share(stages, "forward", float(summary.total_tokens or 1)),
        "mismatch_messages": [e["message"] for e in errors if e.get("reason") == "spot_check_mismatch"][:3],
    }


def scrape(url: str) -> dict[str, float] | None:
    """``bench_gpu_e2e.scrape``; None where the server cannot be read."""
    try:
        return e2e.scrape(url)
    except httpx.HTTPError:
        return None


def stage_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, dict[str, float]] | None:
    """The server's stages between two scrapes: {stage: {"seconds": sum, "count": n}}."""
    if before is None or after is None:
        return None
    diff = e2e.server_stages(before, after)
    return {
        stage: {"seconds": seconds, "count": diff["stage_counts"].get(stage, 0.0)}
        for stage, seconds in diff["stage_seconds_sum"].items()
    }


def share(stages: dict[str, dict[str, float]] | None, stage: str, over: float) -> float | None:
    """Seconds of ``stage`` over ``over``; None where the server has no such stage."""
    if stages is None or stage not in stages:
        return None
    return stages[stage]["seconds"] / over


class Clock:
    """The call's deadline: a phase starts only if its estimate fits."""

    def __init__(self, deadline_s: float) -> None:
        self.started = time.monotonic()
        self.deadline_s = deadline_s

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.started)

    def allows(self, estimate_s: float, what: str) -> bool:
        if self.left() >= estimate_s:
            return True
        log.warning("skipping %s: %.0f s left, it needs about %.0f s", what, self.left(), estimate_s)
        return False


# -- the phases -------------------------------------------------------------------------------------------------
def default_plan(data: Path, args: argparse.Namespace) -> list[tuple[str, Path, dict[str, Any]]]:
    """Off, the default in bf16, the default in FP8: interleaved, ``--repeats`` times."""
    plan: list[tuple[str, Path, dict[str, Any]]] = []
    for _ in range(args.repeats):
        plan += [
            ("off", data, {**BF16, "spot_check_every": 0}),
            ("default_bf16", data, {**BF16}),
            ("default_fp8", data, {**FP8}),
        ]
    return plan


def every_row_plan(data: Path, args: argparse.Namespace) -> list[tuple[str, Path, dict[str, Any]]]:
    every = {"spot_check_every": 1, "spot_check_max_tokens": args.every_row_max_tokens}
    return [("every_row_bf16", data, {**BF16, **every}), ("every_row_fp8", data, {**FP8, **every})] * args.every_row_repeats


def clean_runs(url: str, plan: list[tuple[str, Path, dict[str, Any]]], work: Path, args: argparse.Namespace,
               clock: Clock, results: dict[str, Any], save: Any) -> None:  # fmt: skip
    runs: list[dict[str, Any]] = results.setdefault("runs", [])
    estimate = 10.0 + 0.02 * args.rows  # until a run is measured: the H200 ran 2000 rows in 21-29 s (8B, Kimi shapes)
    for name, dataset, settings in plan:
        if not clock.allows(estimate * 1.3, f"run {name}"):
            continue
        log.info("run %s (%s)", name, settings)
        run = {"name": name, **extract(url, dataset, work / "out", args, **settings)}
        estimate = max(estimate if name.startswith("every") else 0.0, run["seconds"] + 5)
        spot = run["spot_checks"] or {}
        log.info("run %s: %s, %.1f rows/s, %s rows checked, %s differed", name, run["status"], run["samples_per_s"],
                 spot.get("checked_rows"), spot.get("mismatched_rows"))  # fmt: skip
        runs.append(run)
        save()


def fault_runs(model_dir: Path, work: Path, data: Path, args: argparse.Namespace, clock: Clock,
               results: dict[str, Any], save: Any, then_clean: Path | None = None) -> None:  # fmt: skip
    """Each fault on one in-process engine; then, with ``then_clean``, every row of it checked on the same engine
    healthy (``inprocess_every_row_*`` runs: the server in this process, for a call too short to start another)."""
    if not clock.allows(args.fault_estimate_s, "the fault runs"):
        return
    engine = FaultyEngine(ServeConfig(
        model=model_dir, dump_dir=work / "fault-dumps", device=args.device, max_batch_tokens=args.max_batch_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
    ))  # fmt: skip
    front = HttpFront(engine, "127.0.0.1", 0)
    threading.Thread(target=front.serve_forever, name="bench-http", daemon=True).start()
    url = f"http://127.0.0.1:{front.port}"
    faults: list[dict[str, Any]] = results.setdefault("faults", [])
    try:
        for fault in FAULT_NAMES:
            storages = ["fp8"] if fault == "fp8_scale_doubled" else ["bf16"] if fault == "final_before_norm" else ["bf16", "fp8"]
            for storage in storages:
                if not clock.allows(30, f"fault {fault} ({storage})"):
                    continue
                engine.fault = fault
                run = extract(url, data, work / "fault-out", args, spot_check_max_mismatches=1,
                              **(FP8 if storage == "fp8" else BF16))  # fmt: skip
                spot = run["spot_checks"] or {}
                caught = run["status"] == "stopped" and spot.get("checked_rows") == spot.get("mismatched_rows") == 1
                faults.append({"fault": fault, "storage": storage, "caught_on_first_checked_row": caught, **run})
                log.info("fault %s (%s): %s", fault, storage, "caught" if caught else f"NOT caught ({run['status']})")
                save()
        engine.fault = None
        if then_clean is not None:
            plan = [(f"inprocess_{name}", dataset, settings) for name, dataset, settings in every_row_plan(then_clean, args)]
            clean_runs(url, plan, work, args, clock, results, save)
    finally:
        front.shutdown()
        engine.shutdown()
        del engine
        if args.device == "cuda":
            torch.cuda.empty_cache()


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def device_cost_met(span: float | None, slowdown: float | None, idled: float | None) -> bool | None:
    """The checks' spans within the budget, or the rows' forwards neither slowed nor left idle by more than it."""
    if span is None:
        return None
    allowed = 1 - TARGET_COST_RATIO
    if span <= allowed:
        return True
    return slowdown is not None and idled is not None and slowdown <= 1 / TARGET_COST_RATIO and idled <= allowed


def headline(results: dict[str, Any]) -> dict[str, Any]:
    runs = results.get("runs", [])
    clean = [r for r in runs if r["name"] != "off"]  # every run with the check on, on a healthy engine
    false_alarms = sum((r["spot_checks"] or {}).get("mismatched_rows", 0) for r in clean)
    rate = {
        name: [r["samples_per_s"] for r in runs if r["name"] == name and r["status"] == "complete"]
        for name in ("off", "default_bf16")
    }
    ratio = statistics.median(rate["default_bf16"]) / statistics.median(rate["off"]) if all(rate.values()) else None
    pairs = [default / off for off, default in zip(rate["off"], rate["default_bf16"], strict=False)]
    tensors: dict[str, dict[str, Any]] = {}
    for run in clean:
        for name, record in ((run["spot_checks"] or {}).get("tensors") or {}).items():
            key = f"{'fp8' if run['name'].endswith('fp8') else 'bf16'} {name}"  # over every clean run
            into = tensors.setdefault(key, {"worst_matching_error": 0.0, "smallest_separation": None, "nearest": "",
                                            "least_sureness": None, "worst_rounding": 0.0, "rows": 0, "differed": 0,
                                            "not_judged": 0})  # fmt: skip
            into["rows"] += record["rows"]
            into["differed"] += record["differed"]
            into["not_judged"] += record["not_judged"]
            into["worst_matching_error"] = max(into["worst_matching_error"], record["worst_matching_error"])
            into["worst_rounding"] = max(into["worst_rounding"], record.get("worst_rounding", 0.0))
            for field, better in (("smallest_separation", min), ("least_sureness", min)):
                if record[field] is not None:
                    into[field] = record[field] if into[field] is None else better(into[field], record[field])
                    if field == "smallest_separation" and into[field] == record[field]:
                        into["nearest"] = record["nearest_alternative"]

    def of(name: str, field: str) -> list[float]:
        return [r[field] for r in runs if r["name"] == name and r.get(field) is not None]

    spans = of("default_bf16", "server_check_span_share")
    host_shares = of("default_bf16", "server_check_host_share")
    busy = {name: median_or_none(of(name, "rows_stream_busy_share")) for name in ("off", "default_bf16")}
    per_token = {name: median_or_none(of(name, "forward_seconds_per_token")) for name in ("off", "default_bf16")}
    slowdown = per_token["default_bf16"] / per_token["off"] if per_token["off"] and per_token["default_bf16"] else None
    idled = busy["off"] - busy["default_bf16"] if busy["off"] is not None and busy["default_bf16"] is not None else None
    span = median_or_none(spans)
    faults = results.get("faults", [])
    return {
        "clean_runs": len(clean),
        "clean_runs_complete": sum(r["status"] == "complete" for r in clean),
        "false_alarm_rows": false_alarms,
        "checked_rows": sum((r["spot_checks"] or {}).get("checked_rows", 0) for r in clean),
        "default_vs_off_rate_ratio": ratio,
        "default_vs_off_pair_ratios": pairs,
        "default_vs_off_pair_ratio_median": statistics.median(pairs) if pairs else None,
        "default_cost_target_met": None if ratio is None else ratio >= TARGET_COST_RATIO,
        # the same cost without the machine's drift, from the server's stages: met when the checks' spans fit in
        # the budget, or when the rows' forwards were neither idled nor slowed by more than it
        "default_server_check_span_shares": spans,
        "default_server_check_span_share_median": span,
        "rows_stream_busy_share_median": busy,
        "default_vs_off_forward_seconds_per_token": slowdown,
        "default_device_cost_target_met": device_cost_met(span, slowdown, idled),
        # the check thread's host time launching the checks: on a busy GPU partly a wait for room in the launch queue
        "default_server_check_host_share_median": median_or_none(host_shares),
        "faults_caught": f"{sum(f['caught_on_first_checked_row'] for f in faults)}/{len(faults)}",
        "per_tensor": tensors,
    }


# -- main ---------------------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-gpu-spot-check.json"), help="result JSON (default: %(default)s)")
    add("--work", type=Path, default=Path(__file__).resolve().parent / "work", help="scratch: models, outputs")
    add("--models", default="8b,kimi", help="comma-separated: 8b, kimi (default: %(default)s)")
    add("--append", action="store_true", help="add to the models already in --out")
    add("--label", default="", help="a suffix of the models' keys in --out (a key already there gets -2, -3, ...)")
    add("--rows", type=int, default=2000)
    add("--median", type=int, default=200, help="median row length")
    add("--longest", type=int, default=1024)
    add("--repeats", type=int, default=3, help="runs of each clean setting")
    add("--every-row-rows", type=int, default=600, help="rows of the every-row-checked runs")
    add("--every-row-repeats", type=int, default=3, help="runs of each every-row-checked setting")
    add("--every-row-max-tokens", type=int, default=defaults.SPOT_CHECK_MAX_TOKENS, help="their spot_check_max_tokens")
    add("--concurrency", type=int, default=ExtractConfig.model_fields["concurrency"].default)
    add("--max-batch-tokens", type=int, default=16384)
    add("--chunked-prefill-size", type=int, default=2048)
    add("--vocab", type=int, default=32000)
    add("--hidden", type=int, default=4096)
    add("--intermediate", type=int, default=14336)
    add("--layers", type=int, default=32)
    add("--heads", type=int, default=32)
    add("--kv-heads", type=int, default=8)
    add("--kimi-hidden", type=int, default=7168)
    add("--kimi-layers", type=int, default=24)
    add("--kimi-heads", type=int, default=64)
    add("--kimi-experts", type=int, default=16)
    add("--kimi-moe-intermediate", type=int, default=512)
    add("--kimi-dense-intermediate", type=int, default=18432)
    add("--kimi-q-lora", type=int, default=1536)
    add("--kimi-kv-lora", type=int, default=512)
    add("--kimi-rope", type=int, default=64)
    add("--kimi-nope", type=int, default=128)
    add("--kimi-v", type=int, default=128)
    add(
        "--phases",
        default="clean",
        choices=["clean", "server", "faults"],
        help="clean: the subprocess server's runs and the faults (default); server: its runs alone; faults: the faults, "
        "then every row checked on the same in-process engine (a short call)",
    )
    add("--fault-estimate-s", type=float, default=120.0, help="time the fault phase needs (model load included)")
    add("--deadline-s", type=float, default=540.0, help="start no phase past this many seconds")
    add("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script end to end, measures nothing")
    args = parser.parse_args()
    args.device = "cpu" if args.cpu_smoke else "cuda"
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.repeats, args.every_row_rows = 40, 40, 200, 1, 12
        args.every_row_repeats = 1
        args.concurrency, args.max_batch_tokens, args.chunked_prefill_size, args.vocab = 8, 512, 64, 1024
        args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads = 64, 128, 8, 4, 2
        args.kimi_hidden, args.kimi_layers, args.kimi_heads, args.kimi_experts = 64, 8, 4, 4
        args.kimi_moe_intermediate, args.kimi_dense_intermediate, args.kimi_q_lora, args.kimi_kv_lora = 32, 128, 32, 16
        args.kimi_rope, args.kimi_nope, args.kimi_v = 8, 8, 16
    return args


def main() -> int:
    args = parse_args()
    e2e.setup_logging("httpx", "httpcore", "transformers", "hsextract.extract.planning.dataset", "hsextract.extract.progress")
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    clock = Clock(args.deadline_s)
    data: dict[str, Any] = json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    data.setdefault("models", {})
    data.update(
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        spot_check_defaults={"every": defaults.SPOT_CHECK_EVERY, "max_tokens": defaults.SPOT_CHECK_MAX_TOKENS},
    )
    args.work.mkdir(parents=True, exist_ok=True)
    scratch = argparse.Namespace(disk_dir=args.work, tmpfs_dir=Path("/dev/shm"))
    data.setdefault("hardware", {})[args.device] = e2e.hardware(scratch)

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1, default=str) + "\n")

    for name in args.models.split(","):
        work = args.work / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        model_dir = work / "model"
        results: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}}
        data["models"][unused_key(data["models"], f"{name}{args.label}")] = results
        results["model"] = make_model(model_dir, kimi_config(args) if name == "kimi" else e2e.llama_config(args), args)
        results["dataset"] = make_dataset(work / "data.jsonl", args.rows, args)
        results["every_row_dataset"] = make_dataset(work / "every.jsonl", args.every_row_rows, args, seed=8)
        make_dataset(work / "faults.jsonl", 64, args, seed=9)
        save()
        log_path = work / "server.log"
        if args.phases in ("clean", "server"):
            serve = e2e.serve_args(args.device, args.max_batch_tokens, args.chunked_prefill_size)
            server, url = e2e.start_server(model_dir, Path("/dev/shm") / f"hsx-bench-spot-{name}", serve, log_path)
            try:
                results["server_ready_s"] = e2e.wait_healthy(url, server, log_path)
                clean_runs(url, default_plan(work / "data.jsonl", args), work, args, clock, results, save)
                if args.phases == "clean":
                    fault_runs(model_dir, work, work / "faults.jsonl", args, clock, results, save)
                clean_runs(url, every_row_plan(work / "every.jsonl", args), work, args, clock, results, save)
            finally:
                e2e.stop_server(server)
        else:  # the faults, then every row checked on the same in-process engine
            fault_runs(model_dir, work, work / "faults.jsonl", args, clock, results, save, then_clean=work / "every.jsonl")
        results["headline"] = headline(results)
        save()
        log.info("%s: %s", name, json.dumps(results["headline"], indent=1))
        shutil.rmtree(work, ignore_errors=True)
    return 0


def unused_key(models: dict[str, Any], key: str) -> str:
    """``key``, or ``key-2``, ``key-3``, ... when --append meets a model already measured: a run never replaces
    another's figures (one did: the 8B model's fault runs were lost to a later server-only run)."""
    if key not in models:
        return key
    taken = next(f"{key}-{n}" for n in range(2, 1000) if f"{key}-{n}" not in models)
    log.warning("%s is already in --out: this run is recorded as %s", key, taken)
    return taken


if __name__ == "__main__":
    sys.exit(main())
