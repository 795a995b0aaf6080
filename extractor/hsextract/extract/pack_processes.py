"""Packing rows in processes of their own, each with its own interpreter lock.

The row threads of one extractor share one interpreter lock. When the forward is fast (short rows, a small
model) that lock is the limit. On one H200, 3000 rows of about 450 tokens went at 140-156 rows a second
whether 16, 64, 256 or 1024 were in flight, and the server batched 1.8 rows at a time, starved. Reading,
checking and writing the dumps held the lock for half of the extractor's locked time.

So :class:`PackProcesses` runs those steps (:func:`hsextract.extract.packing.pack_row`) in ``n`` processes
of their own (:mod:`hsextract.extract.pack_worker`). A row's thread borrows an idle process from a queue
(``queue.SimpleQueue``: no lock to wait on), sends it the job over the process's socket, waits for the answer
and gives the process back. Only the job crosses: the sample's ids, the dump's path, and what the dump must
be. The process reads the dump from the dump directory itself and writes the sample file; the row's thread
syncs the file once it has let go of its turn (row_worker's ``ROWS_PACKED_ON_THREADS``), so the fsyncs of a slow disk
overlap and hold no process. An error comes back whole, and the row's thread handles it as before (retry, skip, stop).

The run's processes are started as programs of their own (:mod:`hsextract.extract.pack_worker` says why), each
importing torch: a second or more. Until each is up, a process forked from the run's as it creates
:class:`PackProcesses`, before its row threads start, stands in for it: up in milliseconds, torch and the packing code
already imported, and stopped at its next turn once a started process is up (:class:`PackProcesses` says why).

A row first waits for a turn: the run has one per process and ``ROWS_PACKED_ON_THREADS`` more
(:mod:`hsextract.extract.row_worker` says why). When no process is idle (all busy, or a replacement still starting)
the row is packed on its own thread. Wide rows (tens of MB) take a turn too: on their threads
at once, their finite checks handed the lock over every 512 KiB among dozens of threads. A process that
dies (killed, out of memory) fails the row it held with
:class:`~hsextract.errors.PackProcessError`, which is retried, and a new process takes its place.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import hsextract
from hsextract.errors import PackProcessError
from hsextract.extract.pack_worker import READY, fork_serving
from hsextract.extract.packing import Packed, PackJob
from hsextract.output.formats.base import OutputFormat

log = logging.getLogger(__name__)

#: how long close() waits for a process to exit before it is killed
CLOSE_TIMEOUT_S = 60.0


class _Forked:
    """A forked child, waited for as a ``subprocess.Popen`` is (the part of its interface ``_Process`` uses)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -9: killed by SIGKILL, as Popen says it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline, pause = time.monotonic() + (math.inf if timeout is None else timeout), 0.0005
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pack process {self.pid}", timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class _Process:
    """One pack process (forked, or ``python -m hsextract.extract.pack_worker``) and the socket to it."""

    def __init__(self, fmt: OutputFormat, output: Path, forked: bool = False) -> None:
        here, there = socket.socketpair()
        self.process: subprocess.Popen[bytes] | _Forked
        if forked:
            self.process = _Forked(fork_serving(there.fileno()))
        else:
            package_root = str(Path(hsextract.__file__).resolve().parents[1])  # importable there as it is here
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hsextract.extract.pack_worker", str(there.fileno())],
                pass_fds=(there.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        there.close()
        self.conn = Connection(here.detach())
        self.conn.send((fmt, output))

    @property
    def stand_in(self) -> bool:
        """A fork: it packs only until a process started as a program is up (PackProcesses says why)."""
        return isinstance(self.process, _Forked)

    def wait_ready(self) -> None:
        """Until it has imported what it needs (EOFError: it died first)."""
        if self.conn.recv() != READY:
            raise EOFError("the pack process did not say it was ready")

    def call(self, job: PackJob) -> tuple[str, Any]:
        self.conn.send(job)
        answer: tuple[str, Any] = self.conn.recv()
        return answer

    def ended(self) -> str:
        """How it ended, for the error of the row it held."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5.0)
        self.conn.close()
        return f"pack process {self.process.pid} ended (exit code {self.process.returncode})"

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError):  # it has ended already
            self.conn.send(None)

    def wait_stopped(self) -> None:
        try:
            self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("pack process %s did not exit within %.0f s; killing it", self.process.pid, CLOSE_TIMEOUT_S)
            self.process.kill()
            self.process.wait()
        self.conn.close()


def stop_all(processes: list[_Process], on_stopped: Callable[[], None] = lambda: None) -> None:
    """Ask every process to stop, then wait for each: they exit together, where one after another was a run's last
    seconds (2.6 s for four on an H100's host, before they skipped the interpreter's teardown: pack_worker says why)."""
    for process in processes:
        process.ask_to_stop()
    for process in processes:
        process.wait_stopped()
        on_stopped()


class PackProcesses:
    """``processes`` pack processes, lent to the row threads one job at a time; ``on_up`` is told how many are up
    (ready for rows) each time that changes: none at first, all within milliseconds.

    Each is started as a program of its own, and until it is up (it imports torch: 1.5-2.5 s on an H100's host) a
    process forked here stands in for it (create this on the run's main thread before its row threads start). The
    forks pack from the first rows on, but a bf16 row cost a forked process about twice the CPU it costs a started one
    on that host (bench/results-gpu-e2e-h100-speculators.json, ``session28``), so each fork is stopped, at its next
    turn, once a started process is up."""

    def __init__(self, processes: int, fmt: OutputFormat, output: Path, on_up: Callable[[int], None] = lambda up: None) -> None:
        if processes < 1:
            raise ValueError(f"PackProcesses needs at least one process, not {processes}")
        self._count, self._fmt, self._output = processes, fmt, output
        self._idle: queue.SimpleQueue[_Process] = queue.SimpleQueue()
        self._up = 0  # ready, and not ended since
        self._on_up = on_up
        self._lock = threading.Lock()
        self._to_retire = 0  # stand-ins to stop at their next turn: one for each started process up
        forked = self._fork_all()
        self._live = processes + len(forked)  # started or starting, less those stopped or not started again
        self._starter = threading.Thread(target=self._start_all, args=(forked,), name="hsextract-pack-start", daemon=True)
        self._starter.start()

    @property
    def processes(self) -> int:
        """How many the run asked for."""
        return self._count

    @property
    def idle(self) -> int:
        """Processes up and waiting for a job now."""
        return self._idle.qsize()

    def pack(self, job: PackJob) -> Packed | None:
        """Pack one row in an idle process (its error, if any, is raised here); None when none is idle (all busy,
        or still starting): the row's own thread packs it then, so the processes add to the threads, never queue."""
        process = self._take_idle()
        if process is None:
            return None
        try:
            outcome, value = process.call(job)
        except (EOFError, OSError) as exc:
            self._count_up(-1)
            error = PackProcessError(
                f"{process.ended()} while it packed row {job.sample.row} ({type(exc).__name__}); the row is tried again. "
                "If this repeats, look for the out-of-memory killer (dmesg), or set pack_processes 0"
            )
            if process.stand_in:  # its started successor is on its way
                with self._lock:
                    self._live -= 1
            else:
                self._replace()
            raise error from None
        if not self._retired(process):
            self._idle.put(process)
        if outcome == "packed":
            assert isinstance(value, Packed)
            return value
        raise value

    def close(self) -> None:
        """End every process (the rows are done: each is idle)."""
        self._starter.join()
        stop_all([self._idle.get() for _ in range(self._live)], on_stopped=lambda: self._count_up(-1))

    def _take_idle(self) -> _Process | None:
        while True:
            try:
                process = self._idle.get_nowait()
            except queue.Empty:
                return None
            if not self._retired(process):
                return process

    def _retire_a_stand_in(self) -> None:
        """Stop an idle stand-in now; with every stand-in busy, the next one to come back."""
        with self._lock:
            self._to_retire += 1
        kept: list[_Process] = []
        while True:
            try:
                process = self._idle.get_nowait()
            except queue.Empty:
                break
            if self._retired(process):
                break
            kept.append(process)
        for process in kept:
            self._idle.put(process)

    def _retired(self, process: _Process) -> bool:
        """Whether ``process`` was a stand-in due to stop, now stopped (a fork exits at once)."""
        if not process.stand_in:
            return False
        with self._lock:
            if not self._to_retire:
                return False
            self._to_retire -= 1
            self._live -= 1
        stop_all([process], on_stopped=lambda: self._count_up(-1))
        return True

    def _count_up(self, change: int) -> None:
        with self._lock:
            self._up += change
            up = self._up
        self._on_up(up)

    def _replace(self) -> bool:
        """A new process in place of one that died, started on the calling thread; if it cannot start, one fewer
        (False)."""
        ended = self._bring_up(_Process(self._fmt, self._output))
        if ended is not None:
            log.error("%s before it was ready: packing goes on with one process fewer", ended)
            with self._lock:
                self._live -= 1
        return ended is None

    def _bring_up(self, process: _Process) -> str | None:
        """``process`` lent out once it is ready; how it ended (:meth:`_Process.ended`) if it died first."""
        try:
            process.wait_ready()
        except (EOFError, OSError):
            return process.ended()
        self._count_up(1)
        self._idle.put(process)
        return None

    def _fork_all(self) -> list[_Process]:
        forked: list[_Process] = []
        try:
            for _ in range(self._count):
                forked.append(_Process(self._fmt, self._output, forked=True))
        except OSError as exc:  # out of memory or processes: the rest start as programs of their own
            log.warning("could not fork a pack process (%s); starting %d as programs", exc, self._count - len(forked))
        return forked

    def _start_all(self, forked: list[_Process]) -> None:
        started = [_Process(self._fmt, self._output) for _ in range(self._count)]  # importing at once
        for stand_in in forked:
            if (ended := self._bring_up(stand_in)) is not None:
                log.warning("%s before it was ready", ended)
                with self._lock:
                    self._live -= 1
        for process in started:
            if (ended := self._bring_up(process)) is not None:
                log.warning("%s before it was ready; starting another", ended)
                if not self._replace():
                    continue
            self._retire_a_stand_in()
