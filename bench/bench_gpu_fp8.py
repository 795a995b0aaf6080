"""FP8 against bf16 on the GPU (issue 17): the same rows, the speculators format, both storages.

The 8B-shaped model and the dataset of ``bench_gpu_e2e.py`` (same flags), one ``hsextract serve
--device cuda``; then, back to back and in alternating order (``--repeats`` pairs), ``hsextract
extract --format speculators`` into the local disk with the states stored as bfloat16 and with
``--storage float8_e4m3fn`` (quantized on the GPU before the copy to the host). Per run: tokens/s,
output bytes per token. Then the error of FP8 against bf16 on ``--error-rows`` rows: (1) the stored
FP8 values dequantized against the bf16 output of the same rows (FP8's rounding plus the bf16 noise of
other batch neighbours), and (2) FP8's own rounding: the bf16 output quantized per token and
dequantized against itself. Each as the per-token relative Frobenius error and the largest element
error relative to the token's amax (max and mean over tokens).
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

import bench_gpu_e2e as e2e
import torch
from safetensors.torch import load_file

from hsextract.api import ExtractConfig, Extraction, ExtractMetrics
from hsextract.contract.files.fp8 import (
    FP8_STORAGE,
    dequantize,
    max_error_over_amax,
    quantize_per_token,
    relative_frobenius_error,
)

log = logging.getLogger("bench_gpu_fp8")
TARGETS = {"fp8_vs_bf16_tokens_per_s_ratio": 1.0, "fp8_vs_bf16_bytes_ratio_max": 0.52}


def one_run(url: str, data: Path, output: Path, args: argparse.Namespace, storage: str | None, tokens: int) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "server": url, "dataset": data, "output": output, "format": "speculators", "max_seq_len": args.max_seq_len,
        "concurrency": args.concurrency, "log_interval_s": 30.0,
    }  # fmt: skip
    if storage is not None:
        settings["storage"] = storage
    started = time.perf_counter()
    summary = Extraction(ExtractConfig.model_validate(settings), metrics=ExtractMetrics()).run()
    seconds = time.perf_counter() - started
    if summary.total_tokens != tokens:
        raise RuntimeError(f"extraction ended {summary.status} with {summary.total_tokens}/{tokens} tokens written")
    written = sum(json.loads(line)["bytes"] for line in (output / "samples.jsonl").read_text().splitlines())
    return {
        "storage": storage or "bfloat16",
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "output_bytes": written,
        "bytes_per_token": round(written / tokens, 1),
        "late_answers": summary.late_answers,
    }


def keep_rows(output: Path, into: Path, rows: int) -> None:
    """The first rows' sample files, kept for the error figures; the rest of the output goes (disk space)."""
    shutil.rmtree(into, ignore_errors=True)
    (into / "hidden_states").mkdir(parents=True)
    for row in range(rows):
        name = f"hidden_states/hs_{row}.safetensors"
        shutil.copyfile(output / name, into / name)
    shutil.rmtree(output)


def errors(fp8_out: Path, bf16_out: Path, rows: int, device: torch.device) -> dict[str, Any]:
    stored: dict[str, list[float]] = {"frob_max": [], "frob_mean": [], "amax_max": [], "amax_mean": []}
    rounding: dict[str, list[float]] = {k: [] for k in stored}
    for row in range(rows):
        fp8 = load_file(str(fp8_out / "hidden_states" / f"hs_{row}.safetensors"))
        bf16 = load_file(str(bf16_out / "hidden_states" / f"hs_{row}.safetensors"))["hidden_states"].to(device)
        restored = dequantize(fp8["hidden_states"].to(device), fp8["hidden_states_scales"].to(device), torch.float32)
        q, scales = quantize_per_token(bf16)
        own = dequantize(q, scales, torch.float32)
        for into, got in ((stored, restored), (rounding, own)):
            frob, amax = relative_frobenius_error(got, bf16.float()), max_error_over_amax(got, bf16.float())
            into["frob_max"].append(frob.max)
            into["frob_mean"].append(frob.mean)
            into["amax_max"].append(amax.max)
            into["amax_mean"].append(amax.mean)

    def summary(values: dict[str, list[float]]) -> dict[str, float]:
        return {
            "relative_frobenius_per_token_max": max(values["frob_max"]),
            "relative_frobenius_per_token_mean": statistics.fmean(values["frob_mean"]),
            "max_element_error_over_token_amax_max": max(values["amax_max"]),
            "max_element_error_over_token_amax_mean": statistics.fmean(values["amax_mean"]),
        }

    return {
        "rows": rows,
        "stored_fp8_vs_bf16_output": summary(stored),
        "fp8_rounding_of_the_bf16_output": summary(rounding),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-gpu-fp8.json"))
    add("--disk-dir", type=Path, default=Path(__file__).resolve().parent / "work")
    add("--tmpfs-dir", type=Path, default=Path("/dev/shm"))
    add("--repeats", type=int, default=1, help="pairs of (bf16, fp8) runs, the order alternating")
    add("--error-rows", type=int, default=64)
    e2e.add_workload_args(parser)
    add("--max-batch-tokens", type=int, default=16384)
    add("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script, measures nothing")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.max_seq_len, args.error_rows = 48, 60, 300, 200, 8
        args.max_batch_tokens, args.chunked_prefill_size, args.concurrency = 1024, 128, 16
    return e2e.finish_args(args)


def main() -> int:
    e2e.setup_logging("httpx", "httpcore", "transformers", "hsextract")
    args = parse_args()
    e2e.SAMPLER = e2e.GpuSampler()
    results = e2e.Results(args.out)
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    tmpfs = Path(tempfile.mkdtemp(prefix="hsx-fp8-", dir=args.tmpfs_dir))
    disk = Path(tempfile.mkdtemp(prefix="hsx-fp8-", dir=args.disk_dir))
    config = e2e.config_json(args)
    results.update(hardware=e2e.hardware(args), config=config, targets=TARGETS)
    server: subprocess.Popen[bytes] | None = None
    device = torch.device(args.device)
    try:
        e2e.make_model(tmpfs / "model", args, device)
        data = tmpfs / "data.jsonl"
        dataset = e2e.make_dataset(data, args)
        tokens = dataset["tokens"]
        results.update(dataset={k: v for k, v in dataset.items() if k != "lengths_truncated"})
        server_log = args.out.with_name(args.out.stem + "-server.log")
        server, url = e2e.start_server(tmpfs / "model", tmpfs / "dumps", args, server_log)
        e2e.wait_healthy(url, server, server_log)
        runs: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            order = [None, FP8_STORAGE] if repeat % 2 == 0 else [FP8_STORAGE, None]
            for storage in order:
                name = "fp8" if storage else "bf16"
                runs.append(one_run(url, data, disk / name, args, storage, tokens))
                log.info("%s", runs[-1])
                results.update(runs=runs)
                keep_rows(disk / name, disk / f"kept-{name}", min(args.error_rows, args.rows))
        results.update(error=errors(disk / "kept-fp8", disk / "kept-bf16", min(args.error_rows, args.rows), device))
        by = {s: [r for r in runs if r["storage"] == s] for s in ("bfloat16", FP8_STORAGE)}
        rate = {s: statistics.median(r["tokens_per_s"] for r in rs) for s, rs in by.items()}
        per_token = {s: statistics.median(r["bytes_per_token"] for r in rs) for s, rs in by.items()}
        headline = {
            "tokens_per_s": rate,
            "bytes_per_token": per_token,
            "fp8_vs_bf16_tokens_per_s_ratio": rate[FP8_STORAGE] / rate["bfloat16"],
            "fp8_vs_bf16_bytes_ratio": per_token[FP8_STORAGE] / per_token["bfloat16"],
        }
        speed, size = headline["fp8_vs_bf16_tokens_per_s_ratio"], headline["fp8_vs_bf16_bytes_ratio"]
        headline["met"] = {
            "fp8_vs_bf16_tokens_per_s_ratio": speed >= TARGETS["fp8_vs_bf16_tokens_per_s_ratio"],
            "fp8_vs_bf16_bytes_ratio_max": size <= TARGETS["fp8_vs_bf16_bytes_ratio_max"],
        }
        results.update(**headline)
        print(json.dumps({**headline, "error": results.data["error"]}, indent=1))
    finally:
        if server is not None:
            e2e.stop_server(server)
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
