"""Core throughput benchmark of hsextract; writes one JSON file of ratios and absolute figures.

1. pack_vs_copy_ratio: the extractor's per-sample pack stage (``read_dump`` then
   ``SpecForgeFormat.write_sample``) in bytes/s of .ckpt written, against ``shutil.copyfile`` of the
   same dumps' hidden.safetensors in bytes/s copied. Dumps are freshly written each repeat on the
   filesystem of --work-dir (and of /dev/shm with --shm); both stages read those just-written files
   and start after an ``os.sync()``; their order alternates by repeat; medians are reported.
2. e2e_vs_forward_ratio: ``Extraction.run()`` in-process (preflight and planning included: the
   headline) against a ``hsextract serve`` subprocess on CPU whose start-up is not timed, in
   samples/s, against an in-process ``Engine(dump=False)`` fed the same truncated samples under the
   extractor's rids at the same concurrency. The two alternate by repeat; medians are reported.
   By default each forward holds one request (--max-batch-tokens 1): the engine batches whatever
   has arrived, and arrival timing differs between HTTP and in-process submission, so larger
   batches would measure batch formation rather than the extractor's overhead.
   Each speculators output is also verified: ``verify_vs_read_ratio`` is the seconds of reading its sample
   files' bytes against those of ``hsextract verify`` (which reads, checksums, loads and checks them), both
   from the page cache, per storage.
3. fp8_vs_bf16_dump_bytes: hidden.safetensors bytes of one FP8 dump (``contract.fp8``: the K aux and
   the pre-norm final state quantized per token) against the bf16 dump of the same rows (aux, final,
   and the pre-norm final speculators needs), and the CPU seconds of the quantization
   (``--dump-bytes-only`` runs just this).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import torch
import transformers
from bench_gpu_e2e import setup_logging, stop_server

from hsextract.api import (
    Engine,
    ExtractConfig,
    Extraction,
    Sample,
    ServeConfig,
    SpecForgeFormat,
    iter_raw_rows,
    validate_row,
    verify_output,
)
from hsextract.contract.files.dumps import HIDDEN_FILE, DumpSource, read_dump, write_dump, write_fp8_dump
from hsextract.contract.files.fp8 import bytes_per_token, quantize_per_token
from hsextract.contract.rids import make_rid
from hsextract.dev.sample_data import make_sample_data
from hsextract.dev.tiny_model import make_tiny_model

log = logging.getLogger("bench_core")
TARGETS = {"pack_vs_copy_ratio": 0.7, "e2e_vs_forward_ratio": 0.9}
VOCAB = 4096
MAX_SEQ_LEN: int = ExtractConfig.model_fields["max_seq_len"].default  # the extractor's truncation


def _pack(dumps: list[Path], samples: list[Sample], out: Path) -> int:
    """The pipeline's pack stage over every dump; returns the .ckpt bytes written."""
    fmt = SpecForgeFormat(out)
    return sum(fmt.write_sample(sample, read_dump(directory)).bytes for directory, sample in zip(dumps, samples, strict=True))


def _copy(dumps: list[Path], out: Path) -> int:
    out.mkdir(parents=True)
    for index, directory in enumerate(dumps):
        shutil.copyfile(directory / HIDDEN_FILE, out / f"{index}.safetensors")
    return sum(path.stat().st_size for path in out.iterdir())


def _random_dump_inputs(
    seed: int, args: argparse.Namespace
) -> tuple[torch.Generator, torch.Tensor, torch.Tensor, torch.Tensor, DumpSource]:
    """Random bf16 states of ``args.tokens`` x ``args.aux`` x ``args.hidden``; the generator goes on for more."""
    gen = torch.Generator().manual_seed(seed)
    t, k, h = args.tokens, args.aux, args.hidden
    ids = torch.randint(0, VOCAB, (t,), generator=gen)
    aux = torch.randn((t, k, h), generator=gen).to(torch.bfloat16)
    final = torch.randn((t, h), generator=gen).to(torch.bfloat16)
    source = DumpSource("bench", "0", "random", layer_ids=list(range(k)), capture_indices=[i + 1 for i in range(k)])
    return gen, ids, aux, final, source


def bench_pack(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Pack and copy ``args.dumps`` fresh dumps under ``root``, ``args.repeats`` times; removes what it wrote."""
    t = args.tokens
    _, ids, aux, final, source = _random_dump_inputs(0, args)
    prenorm = final.clone() if args.prenorm else None
    samples = [Sample(row, ids.tolist(), [1] * t, t) for row in range(args.dumps)]
    seconds: dict[str, list[float]] = {"pack": [], "copy": []}
    nbytes: dict[str, list[int]] = {"pack": [], "copy": []}
    for repeat in range(args.repeats):
        dumps = [write_dump(root / "dumps", make_rid(s.row, t), ids, aux, final, source, prenorm) for s in samples]
        for stage in ("pack", "copy") if repeat % 2 == 0 else ("copy", "pack"):
            os.sync()  # neither stage pays for the other's (or the dumps') writeback
            started = time.perf_counter()
            size = _pack(dumps, samples, root / "pack") if stage == "pack" else _copy(dumps, root / "copy")
            seconds[stage].append(time.perf_counter() - started)
            nbytes[stage].append(size)
        for name in ("dumps", "pack", "copy"):
            shutil.rmtree(root / name)
    pack_rate, copy_rate = (
        statistics.median(b / s for b, s in zip(nbytes[x], seconds[x], strict=True)) for x in ("pack", "copy")
    )
    pairs = zip(nbytes["pack"], seconds["pack"], nbytes["copy"], seconds["copy"], strict=True)
    paired = [(pack_b / pack_s) / (copy_b / copy_s) for pack_b, pack_s, copy_b, copy_s in pairs]
    return {
        "pack_vs_copy_ratio": pack_rate / copy_rate,
        "pack_bytes_per_s": pack_rate,
        "copy_bytes_per_s": copy_rate,
        "pack_vs_copy_ratio_paired_median": statistics.median(paired),
        "pack_bytes": nbytes["pack"][0],
        "copy_bytes": nbytes["copy"][0],
        "pack_seconds": seconds["pack"],
        "copy_seconds": seconds["copy"],
    }


def bench_dump_bytes(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Bytes of the FP8 dump and of the bf16 dump (with the pre-norm state) of the same rows."""
    t, h = args.tokens, args.hidden
    gen, ids, aux, final, source = _random_dump_inputs(1, args)
    prenorm = torch.randn((t, h), generator=gen).to(torch.bfloat16)
    bf16 = write_dump(root, make_rid(0, t), ids, aux, final, source, prenorm)
    started = time.perf_counter()
    hidden, scales = quantize_per_token(torch.cat([aux, prenorm.unsqueeze(1)], dim=1))
    quantize_s = time.perf_counter() - started
    fp8 = write_fp8_dump(root, make_rid(1, t), ids, hidden, scales, source, model_dtype="bfloat16", final_slot="prenorm")
    fp8_bytes, bf16_bytes = ((d / HIDDEN_FILE).stat().st_size for d in (fp8, bf16))
    shutil.rmtree(root)
    return {
        "fp8_dump_bytes": fp8_bytes,
        "bf16_dump_bytes": bf16_bytes,
        "fp8_vs_bf16_dump_bytes_ratio": fp8_bytes / bf16_bytes,
        "fp8_bytes_per_token_states": bytes_per_token(args.aux + 1, h),
        "fp8_quantize_cpu_seconds": quantize_s,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/health_generate", timeout=30.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    tail = log_path.read_text(errors="replace")[-3000:]  # the log goes with the work dir: show it now
    raise RuntimeError(f"hsextract serve did not become healthy (exit code {server.poll()}); its log ends:\n{tail}")


def load_samples(data: Path) -> list[Sample]:
    """The rows as the extractor validates and truncates them (also what its planning pass does)."""
    return [validate_row(row, raw, VOCAB, MAX_SEQ_LEN) for row, raw in iter_raw_rows(data)]


def forward_seconds(model: Path, samples: list[Sample], args: argparse.Namespace) -> float:
    """Seconds for an in-process Engine, dumping off, to prefill every sample at the given concurrency."""
    chunk, batch_tokens = args.chunked_prefill_size, args.max_batch_tokens
    serve = ServeConfig(model=model, dump_dir=Path("/nonexistent"), chunked_prefill_size=chunk, max_batch_tokens=batch_tokens)
    engine = Engine(serve, dump=False)
    try:
        engine.submit("warmup", [0]).result()  # as the server's health check warms it before extraction
        futures: list[Future[dict[str, Any]]] = []
        started = time.perf_counter()
        for sample in samples:
            while sum(not f.done() for f in futures) >= args.concurrency:
                wait([f for f in futures if not f.done()], return_when=FIRST_COMPLETED)
            futures.append(engine.submit(make_rid(sample.row, len(sample.input_ids)), sample.input_ids))
        wait(futures)
        elapsed = time.perf_counter() - started
        for future in futures:
            future.result()  # raises what a forward raised
        return elapsed
    finally:
        engine.shutdown()


def extract_seconds(
    url: str, data: Path, output: Path, args: argparse.Namespace, expected: int, **settings: str
) -> tuple[float, int]:
    """Wall seconds of ``Extraction.run()`` into a fresh ``output`` and the bytes it wrote; fails unless every
    row was written. ``settings``: further ExtractConfig keys (``format``, ``storage``)."""
    fields = {"server": url, "dataset": data, "output": output, "concurrency": args.concurrency, "log_interval_s": 3600.0}
    config = ExtractConfig.model_validate({**fields, **settings})
    started = time.perf_counter()
    summary = Extraction(config).run()
    elapsed = time.perf_counter() - started
    if summary.status != "complete" or summary.written_now != expected:
        raise RuntimeError(f"extraction ended {summary.status} with {summary.written_now}/{expected} rows written")
    written = sum(json.loads(line)["bytes"] for line in (output / "samples.jsonl").read_text().splitlines())
    return elapsed, written


def bench_e2e(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    model = make_tiny_model(work / "model", "deepseek_v3", args.model_layers, args.model_hidden, VOCAB, dtype=args.model_dtype)
    data = make_sample_data(work / "data.jsonl", args.rows, VOCAB, max_len=args.max_len)
    samples = load_samples(data)
    n, tokens = len(samples), sum(len(s.input_ids) for s in samples)
    dump_dir = Path(tempfile.mkdtemp(prefix="hsx-bench-dumps-", dir="/dev/shm"))
    port, log_path = _free_port(), work / "server.log"
    url = f"http://127.0.0.1:{port}"
    sizes = f"--port {port} --chunked-prefill-size {args.chunked_prefill_size} --max-batch-tokens {args.max_batch_tokens}"
    command = [sys.executable, "-m", "hsextract", "serve", "--model", str(model), "--dump-dir", str(dump_dir), *sizes.split()]
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    fwd, e2e, plan = [], [], []  # seconds per repeat
    storages: dict[str, list[tuple[float, int]]] = {"auto": [], "float8_e4m3fn": []}  # speculators: (seconds, bytes)
    verified: dict[str, list[tuple[float, float]]] = {storage: [] for storage in storages}  # (verify, read) seconds
    try:
        _wait_healthy(url, server, 300.0, log_path)
        for repeat in range(args.e2e_repeats):  # alternating, so drift on a shared machine hits both alike
            fwd.append(forward_seconds(model, samples, args))
            e2e.append(extract_seconds(url, data, work / f"output-{repeat}", args, n)[0])
            for storage in storages if repeat % 2 == 0 else reversed(storages):
                out = work / f"speculators-{storage}-{repeat}"
                storages[storage].append(extract_seconds(url, data, out, args, n, format="speculators", storage=storage))
                verified[storage].append(verify_seconds(out))
                shutil.rmtree(out)
            started = time.perf_counter()
            load_samples(data)
            plan.append(time.perf_counter() - started)
            log.info("repeat %d: forward %.2f s, extract %.2f s (planning about %.3f s)", repeat, fwd[-1], e2e[-1], plan[-1])
    finally:
        stop_server(server)
        shutil.rmtree(dump_dir, ignore_errors=True)
    e2e_s, forward_s = statistics.median(e2e), statistics.median(fwd)
    no_plan_s = statistics.median(e - p for e, p in zip(e2e, plan, strict=True))
    return {
        "e2e_vs_forward_ratio": forward_s / e2e_s,
        "e2e_samples_per_s": n / e2e_s,
        "forward_samples_per_s": n / forward_s,
        "e2e_vs_forward_ratio_excluding_plan": forward_s / no_plan_s,
        "e2e_samples_per_s_excluding_plan": n / no_plan_s,
        "e2e_tokens_per_s": tokens / e2e_s,
        "forward_tokens_per_s": tokens / forward_s,
        "e2e_vs_forward_ratio_per_repeat": [f / e for f, e in zip(fwd, e2e, strict=True)],
        "e2e_seconds": e2e,
        "forward_seconds": fwd,
        "plan_seconds_estimate": plan,
        "samples": n,
        "tokens": tokens,
        "speculators_model_dtype_vs_fp8": {"model_dtype": args.model_dtype, **storage_figures(storages, tokens)},
        "speculators_verify": verify_figures(verified, n),
    }


def verify_seconds(output: Path) -> tuple[float, float]:
    """Seconds of ``verify_output`` on a complete output, then of reading its sample files' bytes."""
    started = time.perf_counter()
    report = verify_output(output)
    verify_s = time.perf_counter() - started
    if not report.ok:
        raise RuntimeError(report.summary())
    files = [output / json.loads(line)["file"] for line in (output / "samples.jsonl").read_text().splitlines()]
    started = time.perf_counter()
    for file in files:
        file.read_bytes()
    return verify_s, time.perf_counter() - started


def verify_figures(runs: dict[str, list[tuple[float, float]]], samples: int) -> dict[str, Any]:
    """Per storage: verify's milliseconds a sample, and reading's seconds over verify's (1.0: verify as fast as a read)."""
    out: dict[str, Any] = {}
    for storage, pairs in runs.items():
        verify_s, read_s = statistics.median(v for v, _ in pairs), statistics.median(r for _, r in pairs)
        out[storage] = {"verify_ms_per_sample": 1e3 * verify_s / samples, "verify_vs_read_ratio": read_s / verify_s}
    return out


def storage_figures(runs: dict[str, list[tuple[float, int]]], tokens: int) -> dict[str, Any]:
    """The speculators format stored in the model's dtype (``auto``) and as FP8, side by side (issue 17)."""
    rate = {s: tokens / statistics.median(r[0] for r in rs) for s, rs in runs.items()}
    per_token = {s: statistics.median(r[1] for r in rs) / tokens for s, rs in runs.items()}
    return {
        "tokens_per_s": rate,
        "bytes_per_token": per_token,
        "fp8_vs_model_dtype_tokens_per_s_ratio": rate["float8_e4m3fn"] / rate["auto"],
        "fp8_vs_model_dtype_bytes_ratio": per_token["float8_e4m3fn"] / per_token["auto"],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results.json"), help="JSON result file (default: %(default)s)")
    add("--work-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="scratch parent on the disk under "
        "test; a per-run subdirectory is made in it and removed (default: bench/work)")  # fmt: skip
    add("--quick", action="store_true", help="small run: 4 dumps of 1024 tokens, 3 repeats, 8 rows, 1 e2e repeat, no /dev/shm")
    add("--dumps", type=int, default=16, help="dumps per pack/copy repeat (default: %(default)s)")
    add("--tokens", type=int, default=2048, help="tokens T per dump (default: %(default)s)")
    add("--aux", type=int, default=3, help="aux layers K per dump (default: %(default)s)")
    add("--hidden", type=int, default=2048, help="hidden size H of the bfloat16 dumps (default: %(default)s)")
    add("--dump-bytes-only", action="store_true", help="measure only the FP8 vs bf16 dump bytes (case 3)")
    add("--prenorm", action="store_true", help="dumps also hold final_prenorm_hidden_state (copied, not packed)")
    add("--repeats", type=int, default=5, help="pack/copy repeats, order alternating (default: %(default)s)")
    add("--shm", action=argparse.BooleanOptionalAction, default=True, help="also measure pack/copy on /dev/shm (default: on)")
    add("--model-hidden", type=int, default=256, help="tiny deepseek_v3 model's hidden size (default: %(default)s)")
    add("--model-layers", type=int, default=8, help="tiny model's layers (default: %(default)s)")
    add("--model-dtype", choices=["bfloat16", "float32"], default="float32", help="tiny model's dtype (default: %(default)s)")
    add("--rows", type=int, default=16, help="sample dataset rows (default: %(default)s)")
    add("--max-len", type=int, default=6000, help=f"longest row, >= 4200; truncated to {MAX_SEQ_LEN} (default: %(default)s)")
    add("--concurrency", type=int, default=8, help="requests in flight, both measurements (default: %(default)s)")
    add("--chunked-prefill-size", type=int, default=2048, help="both measurements (default: %(default)s)")
    # 1 = one request per forward, so batch formation (which depends on arrival timing over HTTP)
    # does not change the forward cost between the two measurements.
    add("--max-batch-tokens", type=int, default=1, help="both measurements (default: %(default)s)")
    add("--e2e-repeats", type=int, default=2, help="forward and extract runs each (default: %(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.dumps, args.tokens, args.repeats, args.rows, args.e2e_repeats, args.shm = 4, 1024, 3, 8, 1, False
    return args


def summary_lines(result: dict[str, Any]) -> list[str]:
    def verdict(name: str) -> str:
        return f"{result[name]:.2f} (target >= {TARGETS[name]}: {'met' if result['met'][name] else 'MISSED'})"

    def rates(pre: str) -> str:
        return f"pack {result[pre + 'pack_bytes_per_s'] / 1e6:.0f} MB/s, copy {result[pre + 'copy_bytes_per_s'] / 1e6:.0f} MB/s"

    lines = [
        f"pack vs copy   {verdict('pack_vs_copy_ratio')}; {rates('')}; paired {result['pack_vs_copy_ratio_paired_median']:.2f}",
        f"e2e vs forward {verdict('e2e_vs_forward_ratio')}; e2e {result['e2e_samples_per_s']:.2f} samples/s, forward "
        f"{result['forward_samples_per_s']:.2f} samples/s; {result['e2e_vs_forward_ratio_excluding_plan']:.2f} without planning",
    ]
    if "shm_pack_vs_copy_ratio" in result:
        lines.append(f"/dev/shm       pack vs copy {result['shm_pack_vs_copy_ratio']:.2f}; {rates('shm_')}")
    if "fp8_dump_bytes" in result:
        lines.append(
            f"fp8 dump       {result['fp8_dump_bytes']} bytes vs bf16 {result['bf16_dump_bytes']} "
            f"({result['fp8_vs_bf16_dump_bytes_ratio']:.3f})"
        )
    if "speculators_model_dtype_vs_fp8" in result:
        side = result["speculators_model_dtype_vs_fp8"]
        rate, size = side["tokens_per_s"], side["bytes_per_token"]
        lines.append(
            f"speculators    {side['model_dtype']}: {size['auto']:.0f} bytes/token, {rate['auto']:.0f} tokens/s; fp8: "
            f"{size['float8_e4m3fn']:.0f} bytes/token, {rate['float8_e4m3fn']:.0f} tokens/s "
            f"(bytes x{side['fp8_vs_model_dtype_bytes_ratio']:.3f}, "
            f"tokens/s x{side['fp8_vs_model_dtype_tokens_per_s_ratio']:.2f})"
        )
    if "speculators_verify" in result:
        lines.append("verify         " + "; ".join(
            f"{storage}: {v['verify_ms_per_sample']:.1f} ms a sample, read/verify {v['verify_vs_read_ratio']:.2f}"
            for storage, v in result["speculators_verify"].items()))  # fmt: skip
    return lines


def main() -> int:
    setup_logging("httpx", "httpcore", "hsextract", "transformers")
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    args = parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-core-", dir=args.work_dir))
    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-pack-", dir="/dev/shm")) if args.shm else None
    try:
        if args.dump_bytes_only:
            sizes = bench_dump_bytes(work / "bytes", args)
            print(json.dumps({**sizes, "tokens": args.tokens, "aux": args.aux, "hidden": args.hidden}, indent=1))
            return 0
        shape = f"{args.dumps} dumps of [{args.tokens}, {args.aux}+1, {args.hidden}] bf16, {args.repeats} repeats"
        log.info("pack vs copy on %s: %s", work, shape)
        result: dict[str, Any] = bench_pack(work / "pack", args)
        if shm is not None:
            log.info("pack vs copy on %s: %s", shm, shape)
            result.update({f"shm_{key}": value for key, value in bench_pack(shm / "pack", args).items()})
        log.info("e2e vs forward: deepseek_v3 hidden %d, %d layers, %s", args.model_hidden, args.model_layers, args.model_dtype)
        result.update(bench_e2e(work / "e2e", args))
        result.update(bench_dump_bytes(work / "bytes", args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    result["targets"] = TARGETS
    result["met"] = {name: result[name] >= target for name, target in TARGETS.items()}
    machine = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    result["machine"] = {**machine, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    result["config"] = {
        **{key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "dump_dtype": "bfloat16",
        "max_seq_len": MAX_SEQ_LEN,
        "e2e_headline": "Extraction.run() wall time, preflight and planning included, server start-up excluded",
    }
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join([*summary_lines(result), f"written to {args.out}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
