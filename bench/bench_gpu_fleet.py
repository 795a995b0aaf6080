"""Fleet benchmark (issue 21): N GPUs of one host, does the extractor side keep up at N times the rate?

The 8B-shaped model and the dataset of ``bench_gpu_e2e.py`` (same flags; --rows-per-gpu rows per GPU
unless --rows is given), then N ``hsextract serve`` processes, one per GPU (N = --gpus, default
``torch.cuda.device_count()``). ``ServeConfig.device`` takes ``cpu`` or ``cuda``, so server i runs
``--device cuda`` with ``CUDA_VISIBLE_DEVICES=i``: its CUDA context, pinned buffers and streams all
live on its own GPU. For each variant (--variants; ``bf16``: the specforge format in the model's
dtype, as bench_gpu_e2e; ``fp8``: the speculators format with ``--storage float8_e4m3fn``, as
bench_gpu_fp8), on the local disk (--disk-dir):

(1) ``single``: server 0 and one extractor over the per-GPU share (``--shard-index 0 --num-shards N``,
    the rows GPU 0 gets in (2); ``--single-scope all``: the whole dataset).
(2) ``fleet``: every server, one ``hsextract extract --shard-index i --num-shards N`` against server
    i, all started together; wall time from their start to the last one's end.
(3) ``hsextract merge`` of the N outputs (hard links, ``--no-verify``), then ``hsextract verify`` of
    the merged output, each timed with its exit code; the merged output is checked: total_samples +
    errors == rows, its samples.jsonl lists exactly the good rows in input order with their lengths,
    errors.jsonl exactly the bad ones (--bad-rows rows are given an id past the vocabulary).
(4) ``disk_write``: the disk's limit as ``bench_gpu_e2e.plain_write`` defines it (each file fsynced, as the
    extractor syncs its samples) for the same files' sizes (from (2)'s samples.jsonl) on the same disk,
    ``DISK_LIMIT_THREADS`` threads per GPU, in tokens/s.

``fleet_vs_n_single_ratio`` = (2) / (N x (1)); ``fleet_vs_limit_ratio`` = (2) / min(N x (1), (4)),
the target >= 0.9 per variant. With --gpus 1 the fleet is one extractor again and the ratio is the
run-to-run noise. Per phase: the host's CPU utilisation (``/proc/stat``, sampled every 0.25 s), each
process's CPU seconds, the servers' per-stage seconds (their ``/metrics`` before and after) and each
extractor's (``hsextract_stage_seconds`` sums from its ``--metrics-port``).

Why one process per extractor: one Python process runs its rows' verify and pack under one GIL
(safetensors and torch.save release it for the bulk copies only), so N extractions in threads of
this process would measure that lock, not the design a fleet runs (one ``hsextract extract`` per
shard, each on its host). Each extractor is ``hsextract extract`` itself (the CLI's ``main``) under
a small wrapper that, once ``main`` returns, writes its exit code, end time and CPU seconds and keeps
the process (and so its metrics endpoint) alive until its per-stage seconds are scraped: the run
writes them nowhere else, and a scrape during the run would miss its last rows.

--cpu-smoke: N = 2 toy servers on the CPU (``--device cpu``), a few rows with two bad ones; it checks
the merged output (``make test`` runs it: tests/test_bench_gpu_fleet.py), not speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bench_gpu_e2e as e2e
import httpx
import torch
import transformers

from hsextract.contract.files.fp8 import FP8_STORAGE

log = logging.getLogger("bench_gpu_fleet")
TARGETS = {"fleet_vs_limit_ratio": 0.9}
#: variant -> (format, --storage): bf16 as bench_gpu_e2e stores it, FP8 as bench_gpu_fp8 does
VARIANTS = {"bf16": ("specforge", None), "fp8": ("speculators", FP8_STORAGE)}
#: ``hsextract extract`` (the CLI's own main) that, once done, reports and holds its /metrics until stdin closes
EXTRACTOR = """\
import json, os, sys, time
from hsextract.cli import main
status, argv = sys.argv[1], sys.argv[2:]
try:
    rc = main(argv)
except SystemExit as exc:
    rc = exc.code if isinstance(exc.code, int) else 1
ended, times = time.time(), os.times()
with open(status + ".tmp", "w") as handle:
    json.dump({"rc": rc, "ended": ended, "cpu_s": times.user + times.system}, handle)
os.replace(status + ".tmp", status)
sys.stdin.read()
sys.exit(rc)
"""


# -- host CPU ---------------------------------------------------------------------------------------------
def read_proc_stat() -> list[int] | None:
    """The aggregate ``cpu`` line of /proc/stat: user nice system idle iowait irq softirq steal (jiffies)."""
    try:
        with open("/proc/stat") as handle:
            return [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process (/proc/<pid>/stat), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def cpu_sampling(into: dict[str, Any], interval_s: float = 0.25) -> Iterator[None]:
    """The host's CPU utilisation over the block, from /proc/stat: busy fraction of all CPUs (and as cores),
    user/system/iowait fractions, and the busiest ``interval_s`` interval."""
    first = read_proc_stat()
    if first is None:
        into["source"] = "none"
        yield
        return
    read: list[list[int] | None] = []
    try:
        with e2e.sampled_every(interval_s, read_proc_stat, read):
            yield
    finally:
        samples = [first, *(sample for sample in read if sample is not None)]  # an unreadable /proc/stat gives None
        last = read_proc_stat()
        samples.append(last if last is not None else samples[-1])

        def busy(a: list[int], b: list[int]) -> float:
            total = sum(b) - sum(a)
            return 1 - ((b[3] - a[3]) + (b[4] - a[4])) / total if total > 0 else 0.0

        total = sum(samples[-1]) - sum(first) or 1
        diff = [b - a for a, b in zip(first, samples[-1], strict=True)]
        cpus = os.cpu_count() or 1
        into.update(
            source="/proc/stat",
            cpus=cpus,
            busy_fraction=busy(first, samples[-1]),
            busy_cores=busy(first, samples[-1]) * cpus,
            user_fraction=(diff[0] + diff[1]) / total,
            system_fraction=(diff[2] + diff[5] + diff[6]) / total,
            iowait_fraction=diff[4] / total,
            busy_fraction_peak=max((busy(a, b) for a, b in itertools.pairwise(samples)), default=0.0),
            samples=len(samples),
        )


# -- servers ----------------------------------------------------------------------------------------------
class Server:
    """One ``hsextract serve`` (bench_gpu_e2e's start_server) on one GPU, or on the CPU."""

    def __init__(self, index: int, model: Path, tmpfs: Path, logs: Path, args: argparse.Namespace) -> None:
        self.index = index
        self.log_path = logs / f"server{index}.log"
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        if args.device == "cuda":  # Popen inherits it; the i-th device this process sees
            os.environ["CUDA_VISIBLE_DEVICES"] = previous.split(",")[index] if previous else str(index)
        try:
            self.process, self.url = e2e.start_server(model, tmpfs / f"dumps{index}", args, self.log_path)
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous


# -- one phase: extractors in their own processes ----------------------------------------------------------------
def extractor_stages(url: str) -> dict[str, Any]:
    """An extractor's ``hsextract_stage_seconds`` sums and counts, and its token and sample counters."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"stage_seconds_sum": {}, "stage_counts": {}}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == "hsextract_stage_seconds_sum":
                out["stage_seconds_sum"][sample.labels["stage"]] = sample.value
            elif sample.name == "hsextract_stage_seconds_count":
                out["stage_counts"][sample.labels["stage"]] = sample.value
            elif sample.name == "hsextract_tokens_total":
                out["tokens_counted"] = sample.value
            elif sample.name == "hsextract_samples_total":
                out.setdefault("samples_counted", {})[sample.labels["status"]] = sample.value
    return out


def extract_command(
    server: Server, data: Path, output: Path, shard: tuple[int, int], port: int, variant: str, args: argparse.Namespace
) -> list[str]:
    fmt, storage = VARIANTS[variant]
    command = [
        "extract", "--server", server.url, "--dataset", str(data), "--output", str(output), "--format", fmt,
        "--max-seq-len", str(args.max_seq_len), "--concurrency", str(args.concurrency), "--shard-index", str(shard[0]),
        "--num-shards", str(shard[1]), "--metrics-port", str(port), "--log-interval-s", "15",
    ]  # fmt: skip
    return command + (["--storage", storage] if storage else [])


def run_phase(
    servers: list[Server],
    shards: list[tuple[int, int]],
    data: Path,
    out: Path,
    variant: str,
    args: argparse.Namespace,
    expected: dict[int, int],
) -> dict[str, Any]:
    """One extractor per (server, shard), all started together; wall time to the last one's end. Each must end
    complete with exactly its shard's tokens (``expected``: row -> tokens of every good row)."""
    out.mkdir(parents=True)
    before = [e2e.scrape(s.url) for s in servers]
    server_cpu = [process_cpu_s(s.process.pid) for s in servers]
    cpu: dict[str, Any] = {}
    children: list[tuple[subprocess.Popen[bytes], Path, str, Path]] = []
    statuses: list[dict[str, Any]] = []
    try:
        with cpu_sampling(cpu):
            started = time.time()
            for server, shard in zip(servers, shards, strict=True):
                port = e2e.free_port()
                status, log_path = out / f"status{shard[0]}.json", out / f"extract{shard[0]}.log"
                command = extract_command(server, data, out / f"shard{shard[0]}", shard, port, variant, args)
                with open(log_path, "wb") as handle:
                    child = subprocess.Popen(
                        [sys.executable, "-c", EXTRACTOR, str(status), *command],
                        stdin=subprocess.PIPE, stdout=handle, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                children.append((child, status, f"http://127.0.0.1:{port}", log_path))
            for child, status, _, log_path in children:
                while not status.exists():
                    if child.poll() is not None:
                        raise RuntimeError(f"extractor exited {child.returncode}; its log ends:\n{tail(log_path)}")
                    time.sleep(0.05)
                statuses.append(json.loads(status.read_text()))
        extractors = []
        for (child, _, url, log_path), status, shard in zip(children, statuses, shards, strict=True):
            if status["rc"] != 0:
                raise RuntimeError(f"extractor of shard {shard} exited {status['rc']}; its log ends:\n{tail(log_path)}")
            config = json.loads((out / f"shard{shard[0]}" / "data_config.json").read_text())
            want = sum(tokens for row, tokens in expected.items() if row % shard[1] == shard[0])
            if config["status"] != "complete" or config["total_tokens"] != want:
                raise RuntimeError(f"shard {shard} ended {config['status']} with {config['total_tokens']}/{want} tokens")
            seconds = status["ended"] - started
            extractors.append(
                {
                    "shard": list(shard),
                    "seconds": seconds,
                    "tokens": config["total_tokens"],
                    "samples": config["total_samples"],
                    "errors": config["bad_input_samples"] + config["failed_samples"],
                    "rows_in_shard": config["rows_in_shard"],
                    "output_bytes": config["total_bytes"],
                    "tokens_per_s": config["total_tokens"] / seconds,
                    "cpu_s": status["cpu_s"],
                    "cpu_cores": status["cpu_s"] / seconds,
                    **extractor_stages(url),
                }
            )
            assert child.stdin is not None
            child.stdin.close()  # scraped: let it exit
    finally:
        for child, status, *_ in children:
            if child.poll() is None and not status.exists():
                child.terminate()  # cut short (an error, Ctrl-C): the extraction stops, writing its summary
            if child.stdin is not None and not child.stdin.closed:
                child.stdin.close()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    seconds = max(s["ended"] for s in statuses) - started
    tokens = sum(e["tokens"] for e in extractors)
    server_cpu_after = [process_cpu_s(s.process.pid) for s in servers]
    return {
        "variant": variant,
        "extractors": len(extractors),
        "seconds": seconds,
        "tokens": tokens,
        "samples": sum(e["samples"] for e in extractors),
        "tokens_per_s": tokens / seconds,
        "output_bytes": sum(e["output_bytes"] for e in extractors),
        "output_gb_per_s": sum(e["output_bytes"] for e in extractors) / seconds / e2e.GB,
        "host_cpu": cpu,
        "how": "seconds: from starting every extractor process to the last one's end (imports, preflight included); "
        "extractor stage seconds: hsextract_stage_seconds sums over its concurrent rows, scraped after its run; "
        "server: its /metrics before and after the phase; cpu_s: the process's user + system CPU seconds",
        "extractor": extractors,
        "server": [
            {
                **e2e.server_stages(b, e2e.scrape(s.url)),
                "cpu_s": None if c0 is None or c1 is None else c1 - c0,
                "cpu_cores": None if c0 is None or c1 is None else (c1 - c0) / seconds,
            }
            for s, b, c0, c1 in zip(servers, before, server_cpu, server_cpu_after, strict=True)
        ],
    }


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


# -- merge, verify, check ----------------------------------------------------------------------------------------
def hsextract(*argv: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hsextract", *argv], capture_output=True, text=True)
    return {"rc": done.returncode, "seconds": time.perf_counter() - started, "output_tail": (done.stdout + done.stderr)[-2000:]}


def merge_and_verify(shard_outs: list[Path], merged: Path, expected: dict[int, int], rows: int) -> dict[str, Any]:
    """``hsextract merge`` then ``hsextract verify``; then the merged output against the dataset: every row
    written or listed in errors.jsonl, written rows in input order with their (truncated) lengths."""
    merge = hsextract("merge", *map(str, shard_outs), "--into", str(merged), "--no-verify")
    verify = hsextract("verify", str(merged)) if merge["rc"] == 0 else {"rc": None, "skipped": "merge failed"}
    result: dict[str, Any] = {"merge": merge, "verify": verify, "rows": rows}
    if merge["rc"] != 0:
        result["ok"] = False
        return result
    config = json.loads((merged / "data_config.json").read_text())
    written = [json.loads(line) for line in (merged / "samples.jsonl").read_text().splitlines()]
    errors = [json.loads(line) for line in (merged / "errors.jsonl").read_text().splitlines()]
    written_rows, error_rows = [r["row"] for r in written], [r["row"] for r in errors]
    checks = {
        "merge_succeeded": True,
        "verify_exit_0": verify["rc"] == 0,
        "status_complete": config["status"] == "complete",
        "samples_plus_errors_equal_rows": config["total_samples"] + config["bad_input_samples"] + config["failed_samples"]
        == rows,
        "rows_in_input_order": written_rows == sorted(written_rows) and error_rows == sorted(error_rows),
        "rows_complete": sorted(written_rows + error_rows) == list(range(rows)),
        "written_rows_are_the_good_rows": written_rows == sorted(expected),
        "lengths_match_input": all(r["num_tokens"] == expected.get(r["row"]) for r in written),
        "total_tokens_match": config["total_tokens"] == sum(expected.values()),
        "merged_from_all_shards": len(config.get("merged_from") or []) == len(shard_outs),
    }
    result.update(
        total_samples=config["total_samples"],
        bad_input_samples=config["bad_input_samples"],
        failed_samples=config["failed_samples"],
        total_tokens=config["total_tokens"],
        shards=len(shard_outs),
        checks=checks,
        ok=all(checks.values()),
    )
    return result


# -- the dataset ---------------------------------------------------------------------------------------------------
def add_bad_rows(data: Path, count: int, vocab: int) -> list[int]:
    """Give ``count`` rows, spread over the dataset, an id past the vocabulary (bad input): the merge's
    errors.jsonl and counts then have something to add up."""
    lines = data.read_text().splitlines()
    bad = sorted({(i * len(lines)) // count + 1 for i in range(count)} & set(range(len(lines)))) if count else []
    for row in bad:
        record = json.loads(lines[row])
        record["input_ids"][0] = vocab + 7
        lines[row] = json.dumps(record)
    data.write_text("\n".join(lines) + "\n")
    return bad


def expected_lengths(data: Path, bad: list[int], max_seq_len: int) -> dict[int, int]:
    """Row -> tokens written, for every good row."""
    lengths = [min(len(r), max_seq_len) for r in e2e.read_rows(data, max_seq_len)]
    return {row: n for row, n in enumerate(lengths) if row not in set(bad)}


# -- main ----------------------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-gpu-fleet.json"), help="result JSON (default: %(default)s)")
    add("--disk-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="local disk (default: bench/work)")
    add("--tmpfs-dir", type=Path, default=Path("/dev/shm"), help="tmpfs: model and dumps (default: %(default)s)")
    add("--gpus", type=int, default=None, help="servers, one per GPU (default: torch.cuda.device_count())")
    add("--variants", default="bf16,fp8", help="comma-separated: bf16 (specforge), fp8 (speculators, float8_e4m3fn)")
    add("--single-scope", choices=["share", "all"], default="share", help="(1) over GPU 0's share or the whole dataset")
    add("--rows-per-gpu", type=int, default=1000, help="rows = this x N unless --rows is given")
    add("--bad-rows", type=int, default=0, help="rows given an id past the vocabulary (bad input)")
    e2e.add_workload_args(parser)
    parser.set_defaults(rows=None)
    add("--max-batch-tokens", type=int, default=16384, help="token budget of one forward of each server")
    add(
        "--cpu-smoke",
        action="store_true",
        help="toy servers on the CPU (N = 2 unless --gpus): checks the merged output, not speed",
    )
    args = parser.parse_args()
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.max_seq_len, args.bad_rows = 20, 40, 160, 128, 2
        args.gpus = 2 if args.gpus is None else args.gpus  # --gpus 1 checks the single-GPU path
        args.max_batch_tokens, args.chunked_prefill_size, args.concurrency = 512, 128, 8
    args = e2e.finish_args(args)
    if args.gpus is None:
        args.gpus = torch.cuda.device_count()
    if args.gpus < 1:
        parser.error("no CUDA device: give --gpus N on a GPU host, or --cpu-smoke to check the script on the CPU")
    if args.device == "cuda" and args.gpus > torch.cuda.device_count():
        parser.error(f"--gpus {args.gpus}, but this host shows {torch.cuda.device_count()} CUDA devices")
    if args.rows is None:
        args.rows = args.rows_per_gpu * args.gpus
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"unknown --variants {sorted(unknown)}: choose from {sorted(VARIANTS)}")
    return args


def check_disk(disk: Path, tokens: int, args: argparse.Namespace, variant: str) -> None:
    per_token = (3 + 1) * args.hidden * (1 if VARIANTS[variant][1] else 2)
    need, free = tokens * per_token * 1.05, shutil.disk_usage(disk).free
    if need > free:
        raise SystemExit(
            f"{disk} has {free / e2e.GB:.1f} GB free, the {variant} fleet writes about {need / e2e.GB:.1f} GB: "
            "pass --disk-dir elsewhere, or fewer --rows-per-gpu"
        )


def headline(variants: dict[str, dict[str, Any]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": n, "by_variant": {}}
    for name, phases in variants.items():
        single, fleet, disk = (phases.get(k, {}).get("tokens_per_s") for k in ("single", "fleet", "disk_write"))
        row: dict[str, Any] = {"single_tokens_per_s": single, "fleet_tokens_per_s": fleet, "disk_tokens_per_s": disk}
        if single and fleet:
            row["n_x_single_tokens_per_s"] = n * single
            row["fleet_vs_n_single_ratio"] = fleet / (n * single)
            row["fleet_host_cpu_busy_fraction"] = phases["fleet"]["host_cpu"].get("busy_fraction")
        if single and fleet and disk:
            row["limit_tokens_per_s"] = min(n * single, disk)
            row["limit"] = "n_x_single" if n * single <= disk else "disk"
            row["fleet_vs_limit_ratio"] = fleet / row["limit_tokens_per_s"]
        if "merged" in phases:
            row["merged_ok"] = phases["merged"]["ok"]
        row["met"] = {k: k in row and row[k] >= target for k, target in TARGETS.items()}
        out["by_variant"][name] = row
    return out


def main() -> int:
    e2e.setup_logging("httpx", "httpcore", "transformers", "hsextract")
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    args = parse_args()
    n = args.gpus
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    results = e2e.Results(args.out)
    disk = Path(tempfile.mkdtemp(prefix="hsx-fleet-", dir=args.disk_dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="hsx-fleet-", dir=args.tmpfs_dir))
    logs = args.out.with_name(args.out.stem + "-logs")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    servers: list[Server] = []
    results.update(hardware={**e2e.hardware(args), "gpus_used": n}, config=e2e.config_json(args), targets=TARGETS)
    ok = True
    try:
        e2e.make_model(tmpfs / "model", args, torch.device(args.device))
        if args.device == "cuda":
            torch.cuda.empty_cache()
        data = tmpfs / "data.jsonl"
        dataset = e2e.make_dataset(data, args)
        bad = add_bad_rows(data, args.bad_rows, args.vocab)
        expected = expected_lengths(data, bad, args.max_seq_len)
        tokens = sum(expected.values())
        results.update(dataset={**{k: v for k, v in dataset.items() if k != "lengths_truncated"}, "bad_rows": bad})
        log.info("dataset: %d rows (%d bad), %d tokens to write; %d servers", args.rows, len(bad), tokens, n)
        servers = [Server(i, tmpfs / "model", tmpfs, logs, args) for i in range(n)]
        healthy = [e2e.wait_healthy(s.url, s.process, s.log_path) for s in servers]
        log.info("servers healthy after %.1f s", max(healthy))
        single_shard = (0, n) if args.single_scope == "share" else (0, 1)
        variants: dict[str, dict[str, Any]] = {}
        for variant in args.variants:
            check_disk(disk, tokens, args, variant)
            phases = variants[variant] = {}
            phases["single"] = run_phase(servers[:1], [single_shard], data, disk / f"{variant}-single", variant, args, expected)
            shutil.rmtree(disk / f"{variant}-single")
            log.info("%s single: %.0f tokens/s", variant, phases["single"]["tokens_per_s"])
            results.update(phases=variants)
            shards = [(i, n) for i in range(n)]
            phases["fleet"] = run_phase(servers, shards, data, disk / f"{variant}-fleet", variant, args, expected)
            log.info("%s fleet of %d: %.0f tokens/s", variant, n, phases["fleet"]["tokens_per_s"])
            results.update(phases=variants)
            outs = [disk / f"{variant}-fleet" / f"shard{i}" for i in range(n)]
            sizes = [json.loads(line)["bytes"] for o in outs for line in (o / "samples.jsonl").read_text().splitlines()]
            phases["merged"] = merge_and_verify(outs, disk / f"{variant}-merged", expected, args.rows)
            ok = ok and phases["merged"]["ok"]
            log.info("%s merge + verify: %s", variant, phases["merged"].get("checks"))
            shutil.rmtree(disk / f"{variant}-merged", ignore_errors=True)
            shutil.rmtree(disk / f"{variant}-fleet")
            results.update(phases=variants)
            phases["disk_write"] = e2e.plain_write(disk / "plain", sizes, tokens, threads=e2e.DISK_LIMIT_THREADS * n)
            log.info("%s plain write: %.2f GB/s", variant, phases["disk_write"]["gb_per_s"])
            results.update(phases=variants, **headline(variants, n))
        print(json.dumps(headline(variants, n), indent=1))
    finally:
        for server in servers:
            e2e.stop_server(server.process)
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
