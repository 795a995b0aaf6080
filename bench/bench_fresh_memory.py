"""How fast sample-sized files go into tmpfs memory left free a while, against memory just freed; one JSON.

Phase c of ``bench_gpu_e2e`` keeps its whole output in tmpfs (28 GB for the wide model's 1000 rows), so every byte of
it lands in memory the run has not touched before. On a virtual machine whose kernel reports free memory to its host
(``page_reporting``: the CI machine's, a Firecracker guest) hands memory that stays free for a while back to its host,
and a page touched again after that costs a fault in the host; a bare-metal host pays only the zeroing. The GPU host
measured on 2026-12-07 had reported nothing (``passes`` 0): there the rested arm meets memory never used since boot, or
memory an earlier arm touched.
This measures that cost as the extractor meets it: ``--processes`` processes (as the pack processes) each write
``--file-mb`` files, sized first and written 1 MiB at a time (as ``SampleFile`` writes a sample), into ``--dir``:

- ``rested``: after ``--rest-s`` seconds with nothing written, each file is kept until the arm ends, so every file
  takes memory that has been free at least that long (as an output that grows over a run does);
- ``reused``: each file is removed as soon as it is written, so the next one takes the pages just freed.

The arms alternate by repeat; each gives GB/s over all processes (bytes over the slowest process's seconds), and the
result gives ``rested_over_reused`` per process count. The kernel's ``page_reporting`` settings are recorded beside.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import time
from datetime import datetime, timezone
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from hsextract.contract.files.dump_pages import tmpfs_mount

MB = 1 << 20
PIECE = MB
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")


def write_files(directory: str, file_bytes: int, total_bytes: int, keep: bool, start: Barrier, out: Any) -> None:
    """One process's share: files of ``file_bytes`` until ``total_bytes``; kept (rested) or removed at once (reused)."""
    block = memoryview(os.urandom(PIECE) * (file_bytes // PIECE))
    start.wait()
    started = time.perf_counter()
    written: list[str] = []
    for index in range(total_bytes // file_bytes):
        path = os.path.join(directory, f"{os.getpid()}-{index}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, file_bytes)  # sized first, as a sample file is
            for offset in range(0, file_bytes, PIECE):
                os.write(fd, block[offset : offset + PIECE])
        finally:
            os.close(fd)
        if keep:
            written.append(path)
        else:
            os.unlink(path)
    out.put(time.perf_counter() - started)
    for path in written:  # after the clock: freeing is not the arm's cost
        os.unlink(path)


def arm(directory: Path, processes: int, file_bytes: int, total_bytes: int, keep: bool) -> float:
    """GB/s over all ``processes`` for one arm."""
    context = multiprocessing.get_context("fork")
    start, out = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=write_files, args=(str(directory), file_bytes, total_bytes, keep, start, out))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    seconds = max(out.get() for _ in workers)
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise SystemExit(f"a writer process failed (exit code {worker.exitcode}); is {directory} full?")
    return processes * total_bytes / seconds / 1e9  # total_bytes is whole files (main rounds it down)


def page_reporting() -> dict[str, str] | None:
    """The guest kernel's free page reporting settings, None where it has none."""
    if not PAGE_REPORTING.is_dir():
        return None
    return {p.name: p.read_text().strip() for p in sorted(PAGE_REPORTING.iterdir()) if os.access(p, os.R_OK)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results-fresh-memory.json"))
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="a tmpfs folder (default: %(default)s)")
    parser.add_argument("--processes", default="1,4", help="comma-separated process counts (default: %(default)s)")
    parser.add_argument("--file-mb", type=int, default=28, help="one file's MiB: the wide model's row (default: %(default)s)")
    parser.add_argument("--gb-per-process", type=float, default=2.0, help="GB each process writes per arm (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rest-s", type=float, default=10.0, help="seconds nothing is written before a rested arm "
                        "(default: %(default)s; on the CI machine the pace fell from 3.6 GB/s at once to 1.4 after 2 s, "
                        "0.87 after 10 s)")
    args = parser.parse_args()
    file_bytes = args.file_mb * MB
    total_bytes = max(file_bytes, int(args.gb_per_process * 1e9) // file_bytes * file_bytes)
    counts = [int(n) for n in args.processes.split(",")]
    free = shutil.disk_usage(args.dir).free
    if free < 1.2 * max(counts) * total_bytes:
        needed = max(counts) * total_bytes / 1e9
        raise SystemExit(f"--dir {args.dir}: {free / 1e9:.1f} GB free, the rested arm needs {needed:.1f}: lower --gb-per-process "
                         "or --processes")  # fmt: skip
    directory = args.dir / f"hsx-fresh-{os.getpid()}"
    directory.mkdir()
    runs: dict[str, dict[str, list[float]]] = {str(n): {"rested": [], "reused": []} for n in counts}
    try:
        for repeat in range(args.repeats):
            for n in counts:
                order = ("rested", "reused") if repeat % 2 == 0 else ("reused", "rested")
                for name in order:
                    if name == "rested":
                        time.sleep(args.rest_s)
                    runs[str(n)][name].append(arm(directory, n, file_bytes, total_bytes, keep=name == "rested"))
    finally:
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()
    summary = {
        n: {
            "rested_gb_per_s": statistics.median(arms["rested"]),
            "reused_gb_per_s": statistics.median(arms["reused"]),
            "rested_over_reused": statistics.median(arms["rested"]) / statistics.median(arms["reused"]),
        }
        for n, arms in runs.items()
    }
    result = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": f"python3 bench/bench_fresh_memory.py --dir {args.dir} --processes {args.processes} --file-mb {args.file_mb} "
        f"--gb-per-process {args.gb_per_process} --repeats {args.repeats} --rest-s {args.rest_s}",
        "hardware": {"cpu_count": os.cpu_count(), "kernel": platform.release(), "page_reporting": page_reporting(),
                     "tmpfs_mount": tmpfs_mount(args.dir)},  # (mount point, huge=), None off tmpfs
        "by_processes": summary,
        "runs_gb_per_s": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
