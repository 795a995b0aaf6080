"""Core throughput benchmark of hsextract; writes one JSON file of ratios and absolute figures.

1. pack_vs_copy_ratio: the extractor's per-sample pack stage (``read_dump`` then
   ``SpecForgeFormat.write_sample``) in bytes/s of .ckpt written, against ``shutil.copyfile`` of the
   same dumps' hidden.safetensors in bytes/s copied. Dumps are freshly written each repeat on the
   filesystem of --work-dir (and of /dev/shm with --shm); both stages read those just-written files
   and run after an ``os.sync()``; their order alternates by repeat; medians are reported.
2. e2e_vs_forward_ratio: ``Extraction.run()`` (in-process, planning and preflight included: the
   headline) against a ``hsextract serve`` subprocess on CPU, in samples/s, against an in-process
   ``Engine(dump=False)`` fed the same truncated samples and rids with the same concurrency.
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
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import torch

from hsextract.config import ExtractConfig
from hsextract.dataset import Sample, iter_raw_rows, validate_row
from hsextract.dumps import HIDDEN_FILE, read_dump, write_dump
from hsextract.formats.specforge import SpecForgeFormat
from hsextract.pipeline import Extraction
from hsextract.rids import make_rid
from hsextract.sample_data import make_sample_data
from hsextract.server.engine import Engine
from hsextract.tiny_model import make_tiny_model

log = logging.getLogger("bench_core")
TARGETS = {"pack_vs_copy_ratio": 0.7, "e2e_vs_forward_ratio": 0.9}
VOCAB = 4096


def _median_rate(nbytes: list[int], seconds: list[float]) -> float:
    return statistics.median(b / s for b, s in zip(nbytes, seconds, strict=True))


# -- 1. pack against copy ----------------------------------------------------------------------------
def _pack(dumps: list[Path], samples: list[Sample], out: Path) -> tuple[int, float, float]:
    """The pipeline's pack stage over every dump; returns (.ckpt bytes, read seconds, write seconds)."""
    fmt = SpecForgeFormat(out)
    total, read_s, write_s = 0, 0.0, 0.0
    for directory, sample in zip(dumps, samples, strict=True):
        started = time.perf_counter()
        dump = read_dump(directory)
        middle = time.perf_counter()
        total += fmt.write_sample(sample, dump)
        read_s, write_s = read_s + middle - started, write_s + time.perf_counter() - middle
    return total, read_s, write_s


def _copy(dumps: list[Path], out: Path) -> int:
    out.mkdir(parents=True)
    total = 0
    for index, directory in enumerate(dumps):
        target = out / f"{index}.safetensors"
        shutil.copyfile(directory / HIDDEN_FILE, target)
        total += target.stat().st_size
    return total


def bench_pack(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Pack and copy ``args.dumps`` dumps under ``root`` (removed after), ``args.repeats`` times."""
    gen = torch.Generator().manual_seed(0)
    t, k, h = args.tokens, args.aux, args.hidden
    ids = torch.randint(0, VOCAB, (t,), generator=gen)
    aux = torch.randn((t, k, h), generator=gen).to(torch.bfloat16)
    final = torch.randn((t, h), generator=gen).to(torch.bfloat16)
    prenorm = final.clone() if args.prenorm else None
    samples = [Sample(row, ids.tolist(), [1] * t, t) for row in range(args.dumps)]
    seconds: dict[str, list[float]] = {"pack": [], "copy": []}
    nbytes: dict[str, list[int]] = {"pack": [], "copy": []}
    read_s: list[float] = []
    write_s: list[float] = []
    for repeat in range(args.repeats):
        dumps = [
            write_dump(root / "dumps", make_rid(s.row, t), ids, aux, final, {"layer_ids": [1, 2, 3]}, prenorm)
            for s in samples
        ]
        for stage in ("pack", "copy") if repeat % 2 == 0 else ("copy", "pack"):
            os.sync()  # neither stage pays for the other's (or the dumps') writeback
            started = time.perf_counter()
            if stage == "pack":
                size, r, w = _pack(dumps, samples, root / "pack")
                read_s.append(r)
                write_s.append(w)
            else:
                size = _copy(dumps, root / "copy")
            seconds[stage].append(time.perf_counter() - started)
            nbytes[stage].append(size)
        for name in ("dumps", "pack", "copy"):
            shutil.rmtree(root / name)
    pack_rate, copy_rate = _median_rate(nbytes["pack"], seconds["pack"]), _median_rate(nbytes["copy"], seconds["copy"])
    return {
        "pack_vs_copy_ratio": pack_rate / copy_rate,
        "pack_bytes_per_s": pack_rate,
        "copy_bytes_per_s": copy_rate,
        "pack_bytes": nbytes["pack"][0],
        "copy_bytes": nbytes["copy"][0],
        "pack_seconds": seconds["pack"],
        "copy_seconds": seconds["copy"],
        "pack_read_dump_share": statistics.median(r / (r + w) for r, w in zip(read_s, write_s, strict=True)),
    }


# -- 2. end to end against the forward -----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"hsextract serve exited with {server.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/health_generate", timeout=30.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"hsextract serve not healthy within {timeout_s:.0f} s; see {log_path}")


def forward_seconds(model: Path, samples: list[Sample], args: argparse.Namespace) -> float:
    """Seconds for an in-process Engine, dumping off, to prefill every sample at the given concurrency."""
    engine = Engine(
        model, Path("/nonexistent-dumping-off"), dump=False,
        chunked_prefill_size=args.chunked_prefill_size, max_batch_tokens=args.max_batch_tokens,
    )
    try:
        engine.submit("warmup", [0]).result()  # what the server's health check does before extraction
        inflight: set[Future[dict[str, Any]]] = set()
        started = time.perf_counter()
        for sample in samples:
            if len(inflight) >= args.concurrency:
                done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
            inflight.add(engine.submit(make_rid(sample.row, len(sample.input_ids)), sample.input_ids))
        for future in wait(inflight).done:
            future.result()
        return time.perf_counter() - started
    finally:
        engine.shutdown()


def extract_seconds(url: str, data: Path, output: Path, args: argparse.Namespace, expected: int) -> tuple[float, float]:
    """(seconds of Extraction.run(), seconds of its planning pass) into a fresh ``output``."""
    config = ExtractConfig(server=url, dataset=data, output=output, concurrency=args.concurrency, log_interval_s=3600.0)
    extraction = Extraction(config)
    plan_s: list[float] = []
    plan: Callable[..., Any] = extraction._plan

    def timed_plan(*a: Any) -> Any:
        started = time.perf_counter()
        try:
            return plan(*a)
        finally:
            plan_s.append(time.perf_counter() - started)

    extraction._plan = timed_plan  # type: ignore[method-assign]
    started = time.perf_counter()
    summary = extraction.run()
    elapsed = time.perf_counter() - started
    if summary.status != "complete" or summary.written_now != expected:
        raise RuntimeError(f"extraction ended {summary.status} with {summary.written_now}/{expected} written")
    return elapsed, sum(plan_s)


def bench_e2e(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    model = make_tiny_model(work / "model", "deepseek_v3", args.model_layers, args.model_hidden, VOCAB, dtype=args.model_dtype)
    data = make_sample_data(work / "data.jsonl", args.rows, VOCAB, max_len=args.max_len)
    samples = [validate_row(row, raw, VOCAB, ExtractConfig.model_fields["max_seq_len"].default) for row, raw in iter_raw_rows(data)]
    n, tokens = len(samples), sum(len(s.input_ids) for s in samples)
    fwd = [forward_seconds(model, samples, args) for _ in range(args.e2e_repeats)]
    dump_dir = Path(tempfile.mkdtemp(prefix="hsx-bench-dumps-", dir="/dev/shm"))
    port, log_path = _free_port(), work / "server.log"
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "hsextract", "serve", "--model", str(model), "--dump-dir", str(dump_dir),
        "--port", str(port), "--chunked-prefill-size", str(args.chunked_prefill_size),
        "--max-batch-tokens", str(args.max_batch_tokens),
    ]
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, server, 300.0, log_path)
        runs = [extract_seconds(url, data, work / f"output-{i}", args, n) for i in range(args.e2e_repeats)]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(dump_dir, ignore_errors=True)
    e2e_s = statistics.median(r[0] for r in runs)
    no_plan_s = statistics.median(r[0] - r[1] for r in runs)
    forward_s = statistics.median(fwd)
    return {
        "e2e_vs_forward_ratio": forward_s / e2e_s,
        "e2e_samples_per_s": n / e2e_s,
        "forward_samples_per_s": n / forward_s,
        "e2e_vs_forward_ratio_excluding_plan": forward_s / no_plan_s,
        "e2e_samples_per_s_excluding_plan": n / no_plan_s,
        "forward_tokens_per_s": tokens / forward_s,
        "e2e_seconds": [r[0] for r in runs],
        "plan_seconds": [r[1] for r in runs],
        "forward_seconds": fwd,
        "samples": n,
        "tokens": tokens,
    }


# -- main ------------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results.json"), help="JSON result file (default: %(default)s)")
    add("--work-dir", type=Path, default=Path(__file__).resolve().parent / "work",
        help="scratch parent on the disk under test; a per-run subdirectory is made and removed (default: bench/work)")
    add("--quick", action="store_true", help="small run: 4 dumps of 1024 tokens, 3 repeats, 16 rows, 1 e2e repeat, no /dev/shm")
    add("--dumps", type=int, default=16, help="dumps per pack/copy repeat (default: %(default)s)")
    add("--tokens", type=int, default=2048, help="tokens per dump (default: %(default)s)")
    add("--aux", type=int, default=3, help="aux layers K per dump (default: %(default)s)")
    add("--hidden", type=int, default=2048, help="hidden size H of the dumps, bfloat16 (default: %(default)s)")
    add("--prenorm", action="store_true", help="dumps also hold final_prenorm_hidden_state, as the embedded server writes")
    add("--repeats", type=int, default=5, help="pack/copy repeats, order alternating (default: %(default)s)")
    add("--shm", action=argparse.BooleanOptionalAction, default=True, help="also measure pack/copy on /dev/shm (default: on)")
    add("--model-hidden", type=int, default=256, help="tiny deepseek_v3 hidden size (default: %(default)s)")
    add("--model-layers", type=int, default=8, help="tiny model layers (default: %(default)s)")
    add("--model-dtype", choices=["bfloat16", "float32"], default="float32", help="tiny model dtype (default: %(default)s)")
    add("--rows", type=int, default=32, help="sample dataset rows (default: %(default)s)")
    add("--max-len", type=int, default=6000, help="longest sample row before truncation to 4096 (default: %(default)s)")
    add("--concurrency", type=int, default=8, help="requests in flight, both measurements (default: %(default)s)")
    add("--chunked-prefill-size", type=int, default=2048, help="both measurements (default: %(default)s)")
    add("--max-batch-tokens", type=int, default=8192, help="both measurements (default: %(default)s)")
    add("--e2e-repeats", type=int, default=2, help="forward and extract runs each, median taken (default: %(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.dumps, args.tokens, args.repeats, args.rows, args.e2e_repeats, args.shm = 4, 1024, 3, 16, 1, False
    return args


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "hsextract"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-core-", dir=args.work_dir))
    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-pack-", dir="/dev/shm")) if args.shm else None
    try:
        log.info("pack vs copy on %s: %d dumps x %d tokens x (%d+1) x %d bf16, %d repeats",
                 work, args.dumps, args.tokens, args.aux, args.hidden, args.repeats)
        pack = bench_pack(work / "pack-bench", args)
        extra = {f"shm_{k}": v for k, v in bench_pack(shm / "pack-bench", args).items()} if shm else {}
        log.info("e2e vs forward: deepseek_v3 hidden %d, %d layers, %s, %d rows", args.model_hidden,
                 args.model_layers, args.model_dtype, args.rows)
        e2e = bench_e2e(work / "e2e", args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    result: dict[str, Any] = {**pack, **e2e, **extra, "targets": TARGETS}
    result["met"] = {name: result[name] >= target for name, target in TARGETS.items()}
    result["machine"] = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                         "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    keys = ("dumps", "tokens", "aux", "hidden", "prenorm", "repeats", "model_hidden", "model_layers", "model_dtype",
            "rows", "max_len", "concurrency", "chunked_prefill_size", "max_batch_tokens", "e2e_repeats", "quick")
    result["config"] = {**{k: getattr(args, k) for k in keys}, "work_dir": str(args.work_dir), "dump_dtype": "bfloat16",
                        "e2e_headline": "Extraction.run() wall time incl. preflight and planning, server start excluded"}
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"pack vs copy   {result['pack_vs_copy_ratio']:.2f} (target >= {TARGETS['pack_vs_copy_ratio']}: "
        f"{'met' if result['met']['pack_vs_copy_ratio'] else 'MISSED'}); pack {pack['pack_bytes_per_s'] / 1e6:.0f} MB/s, "
        f"copy {pack['copy_bytes_per_s'] / 1e6:.0f} MB/s, read_dump {pack['pack_read_dump_share']:.0%} of pack time",
        f"e2e vs forward {result['e2e_vs_forward_ratio']:.2f} (target >= {TARGETS['e2e_vs_forward_ratio']}: "
        f"{'met' if result['met']['e2e_vs_forward_ratio'] else 'MISSED'}); e2e {e2e['e2e_samples_per_s']:.2f} samples/s, "
        f"forward {e2e['forward_samples_per_s']:.2f} samples/s ({e2e['e2e_vs_forward_ratio_excluding_plan']:.2f} without planning)",
    ]
    if extra:
        lines.append(f"/dev/shm       pack vs copy {extra['shm_pack_vs_copy_ratio']:.2f}; pack "
                     f"{extra['shm_pack_bytes_per_s'] / 1e6:.0f} MB/s, copy {extra['shm_copy_bytes_per_s'] / 1e6:.0f} MB/s")
    print("\n".join(lines) + f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
