"""Where a benchmark's processes spend their time: py-spy sampling profiles, summarised for the result JSON.

py-spy is one static binary: handed to a GPU host (nothing is installed there), it attaches to the running server
and extractor by pid. Each profile is taken ``delay_s`` into a phase, for at most ``seconds`` (the phase's steady
state, not its start), and summarised per thread and per function: the share of samples a function was running
(``self``) or on the stack (``inclusive``). The raw samples stay beside the result (``-f raw``). With ``idle`` the waiting threads
are sampled too (py-spy's ``--idle``): where rows in flight wait, not only what the busy threads run. With ``gil`` only
the thread holding the GIL is (``--gil``): what a GIL-bound process spends its one interpreter on. A side named in
``children`` is sampled with its child processes (``--subprocesses``: the extractor's pack processes), summarised apart
as ``<side>_children``; with ``native`` the C and C++ frames are sampled too (``--native``: where a row's copy, check
and checksum spend a pack process's time, below Python), which py-spy does only by pausing the process at each sample.
"""

from __future__ import annotations

import collections
import contextlib
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
from typing import Any, Literal

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
        children: frozenset[str] = frozenset(),
        native: bool = False,
    ) -> None:
        if idle and gil:
            raise SystemExit("--profile-idle and --profile-gil sample opposite sets of threads: give one")
        self.binary, self.raw_prefix, self.delay_s, self.seconds, self.rate = binary, raw_prefix, delay_s, seconds, rate
        self.idle, self.gil, self.children, self.native = idle, gil, children, native
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
                           *(["--native"] if self.native else ["--nonblocking"]), *(["--idle"] if self.idle else []),
                           *(["--gil"] if self.gil else []), *(["--subprocesses"] if side in self.children else [])]  # fmt: skip
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
                    how = {"idle_threads_sampled": self.idle, "gil_holder_only": self.gil, "native_frames": self.native}
                    if side in self.children:
                        summaries[side] = summarize(raw, processes="own") | how
                        summaries[f"{side}_children"] = summarize(raw, processes="children") | how
                    else:
                        summaries[side] = summarize(raw) | how
                else:  # the exit status says what stderr may not: on one H100's host --native --subprocesses left both empty
                    said = stderr.decode(errors="replace").strip()[-500:] or "nothing on stderr"
                    summaries[side] = {"error": f"py-spy exited with {_status(process.returncode)}: {said}"}
                    log.warning("py-spy on %s (%s) wrote nothing: %s", side, phase, summaries[side]["error"])


def _status(returncode: int) -> str:
    """An exit code as a person reads it: ``status 1``, or the signal that ended the process (``SIGSEGV``)."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
    return f"status {returncode}"


def summarize(raw: Path, top: int = 25, processes: Literal["all", "own", "children"] = "all") -> dict[str, Any]:
    """Shares of samples per thread, and per function running (``self``) or on the stack (``inclusive``). A profile
    taken with ``--subprocesses`` starts each stack with its process and the ones above it (``process PID:"cmd"``):
    ``own`` keeps the profiled process's samples, ``children`` those of the processes below it."""
    threads: collections.Counter[str] = collections.Counter()
    running: collections.Counter[str] = collections.Counter()
    on_stack: collections.Counter[str] = collections.Counter()
    total = 0
    pids: set[str] = set()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        depth = next((i for i, part in enumerate(parts) if not part.startswith("process ")), len(parts))
        if (processes == "own" and depth > 1) or (processes == "children" and depth < 2):
            continue
        if depth:
            pids.add(parts[depth - 1].split(":", 1)[0].removeprefix("process "))
        samples = int(count)
        total += samples
        thread, *frames = parts[depth:] or ["?"]
        threads[re.sub(r"_\d+$", "", thread.split(": ", 1)[-1])] += samples  # "thread (tid): pool_7" -> pool
        if frames:
            running[frames[-1]] += samples
        for frame in set(frames):
            on_stack[frame] += samples

    def shares(counter: collections.Counter[str], limit: int) -> list[list[Any]]:
        return [[name, round(n / total, 4)] for name, n in counter.most_common(limit)] if total else []

    return {
        "samples": total,
        **({"processes": len(pids)} if processes == "children" else {}),
        "raw": os.path.basename(raw),
        "threads": shares(threads, top),
        "self": shares(running, top),
        "inclusive": shares(on_stack, top),
    }
