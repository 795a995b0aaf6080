"""A row's way through the dump tmpfs with small pages and with huge pages (``huge=within_size``); writes one JSON.

Each row, on one thread as a dump writer and a pack process see it: the server's ``write_dump`` of one bf16 row
(default 858 tokens x 3 aux + final x 4096: the 8B-shaped wide row of bench_gpu_e2e), the extractor's
``read_dump`` and ``check_dump``, ``SpecForgeFormat.write_sample`` into an output on the same tmpfs (as phase c
of bench_gpu_e2e), and ``remove_dump``. Two real tmpfs mounts, ``huge=never`` and ``huge=within_size``, are made
for the run (root); the two alternate by repeat. Reported per stage: median milliseconds and CPU milliseconds
(user + system) per row, and each arm's ratio to the small-page one. Without root or without tmpfs huge pages the
result says why and nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hsextract.api import DumpExpectation, Sample, SpecForgeFormat, check_dump
from hsextract.contract.files.dump_pages import SHMEM_ENABLED, kernel_override, tmpfs_mount
from hsextract.contract.files.dumps import DumpSource, read_dump, remove_dump, write_dump
from hsextract.contract.rids import make_rid

log = logging.getLogger("bench_dump_pages")
ARMS = ("never", "within_size")
STAGES = ("write_dump", "read_and_check", "write_sample", "remove_dump")


@contextmanager
def mounted(point: Path, huge: str, size_mb: int) -> Iterator[Path]:
    point.mkdir()
    options = f"size={size_mb}m,mode=0700,huge={huge}"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
    if result.returncode != 0:
        raise PermissionError(f"mount -t tmpfs -o {options}: {result.stderr.strip()} (the benchmark needs root)")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


class Clock:
    """Wall and CPU milliseconds of each stage, summed over a repeat's rows."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(STAGES, 0.0)
        self.cpu = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        before, started = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        yield
        elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_THREAD)
        self.wall[stage] += elapsed * 1e3
        self.cpu[stage] += (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3


def one_repeat(root: Path, output: Path, args: argparse.Namespace) -> Clock:
    """``args.rows`` rows through dumps under ``root`` into an output at ``output``; removes what it wrote."""
    tokens, aux_layers, hidden = args.tokens, args.aux, args.hidden
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (tokens,), generator=gen)
    states = torch.randn((tokens, aux_layers + 1, hidden), generator=gen).to(torch.bfloat16)
    aux, final = states[:, :aux_layers].contiguous(), states[:, aux_layers].contiguous()
    layers = list(range(aux_layers))
    source = DumpSource("bench", "0", "random", layer_ids=layers, capture_indices=[i + 1 for i in layers])
    expect = DumpExpectation(layers, [i + 1 for i in layers], hidden, "bfloat16", False)
    fmt = SpecForgeFormat(output)
    clock = Clock()
    for row in range(args.rows):
        sample = Sample(row, ids.tolist(), [1] * tokens, tokens)
        with clock.timed("write_dump"):
            directory = write_dump(root / "dumps", make_rid(row, tokens), ids, aux, final, source)
        with clock.timed("read_and_check"):
            dump = read_dump(directory)
            check_dump(dump, sample.input_ids, expect)
        with clock.timed("write_sample"):
            fmt.write_sample(sample, dump)
        with clock.timed("remove_dump"):
            remove_dump(directory)
    for written in (root / "dumps", output):
        shutil.rmtree(written, ignore_errors=True)
    return clock


def arm_figures(clocks: list[Clock], rows: int) -> dict[str, Any]:
    per_row = {
        kind: {stage: statistics.median(getattr(c, kind)[stage] for c in clocks) / rows for stage in STAGES}
        for kind in ("wall", "cpu")
    }
    total = statistics.median(sum(c.wall.values()) for c in clocks) / rows
    return {"ms_per_row": per_row["wall"], "cpu_ms_per_row": per_row["cpu"], "total_ms_per_row": total}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not SHMEM_ENABLED.exists() or kernel_override() is not None:
        return {"skipped": f"this kernel gives tmpfs no huge pages or decides for every mount ({SHMEM_ENABLED})"}
    row_mb = args.tokens * (args.aux + 1) * args.hidden * 2 / 2**20
    parent = Path(tempfile.mkdtemp(prefix="hsx-bench-pages-"))
    try:
        dump_mb, output_mb = int(row_mb * 2) + 64, int(row_mb * args.rows) + 64
        with (
            mounted(parent / f"dumps-{ARMS[0]}", ARMS[0], dump_mb) as small,
            mounted(parent / f"dumps-{ARMS[1]}", ARMS[1], dump_mb) as huge,
            mounted(parent / "output", "never", output_mb) as output,
        ):
            roots = {ARMS[0]: small, ARMS[1]: huge}
            mounts = {arm: tmpfs_mount(root) for arm, root in roots.items()}
            for arm in ARMS:  # untimed: a virtual machine's first touch of memory costs the host's faults, once
                one_repeat(roots[arm], output / "out", args)
            clocks: dict[str, list[Clock]] = {arm: [] for arm in ARMS}
            for repeat in range(args.repeats):
                for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
                    clocks[arm].append(one_repeat(roots[arm], output / "out", args))
    except PermissionError as exc:
        return {"skipped": str(exc)}
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    arms = {arm: {**arm_figures(clocks[arm], args.rows), "mount_huge": mounts[arm][1] if mounts[arm] else None} for arm in ARMS}
    base = arms[ARMS[0]]
    for arm in arms.values():
        arm["speedup_vs_small_pages"] = {
            stage: base["ms_per_row"][stage] / arm["ms_per_row"][stage] for stage in STAGES if arm["ms_per_row"][stage] > 0
        }
        arm["speedup_vs_small_pages"]["total"] = base["total_ms_per_row"] / arm["total_ms_per_row"]
    return {"row_bytes": int(row_mb * 2**20), "arms": arms}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-dump-pages.json"), help="JSON result file (default: %(default)s)")
    add("--tokens", type=int, default=858, help="tokens per row (default: %(default)s)")
    add("--aux", type=int, default=3, help="aux layers per row (default: %(default)s)")
    add("--hidden", type=int, default=4096, help="hidden size (default: %(default)s)")
    add("--rows", type=int, default=40, help="rows per repeat (default: %(default)s)")
    add("--repeats", type=int, default=6, help="repeats, the arms alternating (default: %(default)s)")
    return parser.parse_args()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    torch.set_num_threads(1)  # as a pack process: one thread, the rows one after another
    log.info("%d rows of [%d, %d+1, %d] bf16 x %d repeats on tmpfs huge=never and huge=within_size",
             args.rows, args.tokens, args.aux, args.hidden, args.repeats)  # fmt: skip
    result = measure(args)
    result["config"] = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    result["machine"] = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__}
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if "skipped" in result:
        print(f"dump pages: not measured: {result['skipped']}")
        return 0
    for arm, figures in result["arms"].items():
        stages = ", ".join(f"{stage} {ms:.2f}" for stage, ms in figures["ms_per_row"].items())
        print(f"huge={arm:<11} {figures['total_ms_per_row']:.2f} ms a row ({stages}); "
              f"x{figures['speedup_vs_small_pages']['total']:.2f} of small pages")  # fmt: skip
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
