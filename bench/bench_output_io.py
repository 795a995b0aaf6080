"""Sample files written with direct I/O against buffered, on the disk under test; writes one JSON.

Each row is the pack's write of one SpecForge sample (default: the 8B-shaped wide row of bench_gpu_e2e, 858 tokens
x 3 aux + final x 4096 bf16, 28 MB) from a dump on tmpfs, then its fsync, as a pack process and the row's thread do.
The two ways alternate by repeat, each into a fresh folder under --work-dir. Reported per row: wall milliseconds,
this process's CPU milliseconds, and the whole machine's (from /proc/stat: the kernel's flusher threads write back
what a buffered write left in the page cache on their own time), medians over the repeats, and direct's ratio to
buffered. The machine's other load counts too: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hsextract.api import Sample, SpecForgeFormat, mount_of, sync_file
from hsextract.contract.files.dumps import DumpSource, read_dump, write_dump
from hsextract.contract.rids import make_rid

log = logging.getLogger("bench_output_io")
WAYS = ("buffered", "direct")


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq of /proc/stat's cpu line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_repeat(fmt: SpecForgeFormat, dump_dir: Path, rows: int) -> dict[str, float]:
    dump = read_dump(dump_dir)
    tokens = int(dump.input_ids.shape[0])
    started, process, machine = time.perf_counter(), process_cpu_seconds(), machine_cpu_seconds()
    for row in range(rows):
        fmt.write_sample(Sample(row, dump.input_ids.tolist(), [1] * tokens, tokens), dump)
        sync_file(fmt.sample_path(row))  # the row's sync
    os.sync()  # what a buffered write still owes the disk is part of its cost
    return {
        "ms_per_row": (time.perf_counter() - started) * 1e3 / rows,
        "process_cpu_ms_per_row": (process_cpu_seconds() - process) * 1e3 / rows,
        "machine_cpu_ms_per_row": (machine_cpu_seconds() - machine) * 1e3 / rows,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    states = torch.randn((args.tokens, args.aux + 1, args.hidden), generator=gen).to(torch.bfloat16)
    layers = list(range(args.aux))
    source = DumpSource("bench", "0", "random", layer_ids=layers, capture_indices=[i + 1 for i in layers])
    work = Path(tempfile.mkdtemp(prefix="bench-output-io-", dir=args.work_dir))
    dumps = Path(tempfile.mkdtemp(prefix="hsx-bench-output-io-", dir="/dev/shm"))
    try:
        dump_dir = write_dump(
            dumps, make_rid(0, args.tokens), torch.arange(args.tokens), states[:, : args.aux].contiguous(),
            states[:, args.aux].contiguous(), source,
        )  # fmt: skip
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for repeat in range(args.repeats + 1):  # the first pair untimed: the disk's and the page cache's first touch
            for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
                fmt = SpecForgeFormat(work / f"{way}-{repeat}")
                fmt.direct_io = way == "direct"
                figures = one_repeat(fmt, dump_dir, args.rows)
                if repeat:
                    runs[way].append(figures)
                shutil.rmtree(fmt.root)
        mount = mount_of(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(dumps, ignore_errors=True)
    ways = {way: {key: statistics.median(run[key] for run in runs[way]) for key in runs[way][0]} for way in WAYS}
    ratios = {key: ways["direct"][key] / ways["buffered"][key] for key in ways["direct"]}
    return {"filesystem": mount.fstype if mount else None, "ways": ways, "direct_vs_buffered": ratios, "runs": runs}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-output-io.json"), help="JSON result file (default: %(default)s)")
    add("--work-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="a folder on the disk under test "
        "(default: bench/work)")  # fmt: skip
    add("--tokens", type=int, default=858, help="tokens per row (default: %(default)s)")
    add("--aux", type=int, default=3, help="aux layers per row (default: %(default)s)")
    add("--hidden", type=int, default=4096, help="hidden size (default: %(default)s)")
    add("--rows", type=int, default=24, help="rows per repeat (default: %(default)s)")
    add("--repeats", type=int, default=6, help="repeats, the two ways alternating (default: %(default)s)")
    return parser.parse_args()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    torch.set_num_threads(1)  # as a pack process
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log.info("%d SpecForge rows of [%d, %d+1, %d] bf16 x %d repeats into %s, buffered and direct",
             args.rows, args.tokens, args.aux, args.hidden, args.repeats, args.work_dir)  # fmt: skip
    result = measure(args)
    result["config"] = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    result["machine"] = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__}
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for way, figures in result["ways"].items():
        print(f"{way:<9} on {result['filesystem']}: " + ", ".join(f"{key} {value:.2f}" for key, value in figures.items()))
    print("direct / buffered: " + ", ".join(f"{key} {value:.2f}" for key, value in result["direct_vs_buffered"].items()))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
