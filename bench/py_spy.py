"""Where a benchmark's processes spend their time: py-spy sampling profiles, summarised for the result JSON.

py-spy is one static binary: handed to a GPU host (nothing is installed there), it attaches to the running server
and extractor by pid. Each profile is taken ``delay_s`` into a phase, for at most ``seconds`` (the phase's steady
state, not its start), and summarised per thread and per function: the share of samples a function was running
(``self``) or on the stack (``inclusive``). The raw samples stay beside the result (``-f raw``). With ``idle`` the waiting threads
are sampled too (py-spy's ``--idle``): where rows in flight wait, not only what the busy threads run. With ``gil`` only
the thread holding the GIL is (``--gil``): what a GIL-bound process spends its one interpreter on.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def find_py_spy(given: str) -> Path:
    """The binary named by ``--py-spy`` (a path, or a name on PATH); a clear error before any work starts."""
    found = shutil.which(given)
    if found is None:
        raise SystemExit(f"--py-spy {given}: no such executable; pass the path of a py-spy binary (pip install py-spy)")
    return Path(found)


class Profiler:
    """Profiles the processes of one phase at a time; without a binary it profiles nothing."""

    def __init__(
        self,
        binary: Path | None,
        raw_prefix: Path,
        delay_s: float,
        seconds: float,
        rate: int = 97,
        idle: bool = False,
        gil: bool = False,
    ) -> None:
        if idle and gil:
            raise SystemExit("--profile-idle and --profile-gil sample opposite sets of threads: give one")
        self.binary, self.raw_prefix, self.delay_s, self.seconds, self.rate = binary, raw_prefix, delay_s, seconds, rate
        self.idle, self.gil = idle, gil
        self.pids: dict[str, int] = {}  # side name -> pid, set once the processes run

    @contextmanager
    def profiling(self, phase: str) -> Iterator[dict[str, Any]]:
        """Profile every side during the block; the yielded dict then holds each side's summary."""
        summaries: dict[str, Any] = {}
        pids = dict(self.pids)
        if self.binary is None or not phase:
            yield summaries
            return
        done = threading.Event()
        running: list[tuple[str, Path, subprocess.Popen[bytes]]] = []

        def start() -> None:
            if done.wait(self.delay_s):
                return  # the phase ended first
            for side, pid in pids.items():
                raw = self.raw_prefix.with_name(f"{self.raw_prefix.name}-py-spy-{phase}-{side}.txt")
                command = [str(self.binary), "record", "--pid", str(pid), "--duration", str(int(self.seconds)),
                           "--rate", str(self.rate), "--format", "raw", "--output", str(raw), "--threads",
                           "--nonblocking", *(["--idle"] if self.idle else []), *(["--gil"] if self.gil else [])]  # fmt: skip
                running.append((side, raw, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))

        starter = threading.Thread(target=start, name=f"py-spy-{phase}", daemon=True)
        starter.start()
        try:
            yield summaries
        finally:
            done.set()
            starter.join()
            if not running:
                summaries["not_profiled"] = f"the phase ended within its first {self.delay_s} s (--profile-delay-s)"
            for side, raw, process in running:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
                _, stderr = process.communicate(timeout=60)
                if raw.exists():
                    summaries[side] = summarize(raw) | {"idle_threads_sampled": self.idle, "gil_holder_only": self.gil}
                else:
                    summaries[side] = {"error": stderr.decode(errors="replace").strip()[-500:]}
                    log.warning("py-spy on %s (%s) wrote nothing: %s", side, phase, summaries[side]["error"])


def summarize(raw: Path, top: int = 25) -> dict[str, Any]:
    """Shares of samples per thread, and per function running (``self``) or on the stack (``inclusive``)."""
    threads: collections.Counter[str] = collections.Counter()
    running: collections.Counter[str] = collections.Counter()
    on_stack: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        thread, *frames = stack.split(";")
        threads[re.sub(r"_\d+$", "", thread.split(": ", 1)[-1])] += samples  # "thread (tid): pool_7" -> pool
        if frames:
            running[frames[-1]] += samples
        for frame in set(frames):
            on_stack[frame] += samples

    def shares(counter: collections.Counter[str], limit: int) -> list[list[Any]]:
        return [[name, round(n / total, 4)] for name, n in counter.most_common(limit)] if total else []

    return {
        "samples": total,
        "raw": os.path.basename(raw),
        "threads": shares(threads, top),
        "self": shares(running, top),
        "inclusive": shares(on_stack, top),
    }
