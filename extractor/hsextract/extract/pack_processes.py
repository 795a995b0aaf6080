"""Packing rows in processes of their own, each with its own interpreter lock.

The row threads of one extractor share one interpreter lock. When the forward is fast (short rows, a small
model) that lock is the limit. On one H200, 3000 rows of about 450 tokens went at 140-156 rows a second
whether 16, 64, 256 or 1024 were in flight, and the server batched 1.8 rows at a time, starved. Reading,
checking and writing the dumps held the lock for half of the extractor's locked time.

So :class:`PackProcesses` runs those steps (:func:`hsextract.extract.packing.pack_row`) in ``n`` processes
of their own (:mod:`hsextract.extract.pack_worker`). A row's thread takes a process with room for a job from a
queue (``queue.SimpleQueue``: no lock to wait on; a process is in it once for each job it can still take), sends it
the job over the process's socket, waits for its answer and puts the process back. A process holds
:data:`JOBS_PER_PROCESS` jobs: it starts the next as soon as it has answered one, without waiting for the extractor's
threads. Only the job crosses: the sample's ids, the dump's path, and what the dump must be. The process reads the dump
from the dump directory itself and writes the sample file; the row's thread syncs the file once it has let go of its
turn (row_worker's ``ROWS_PACKED_ON_THREADS``), so the fsyncs of a slow disk overlap and hold no process. An error
comes back whole, and the row's thread handles it as before (retry, skip, stop).

The run's processes are forked from the run's process as it creates :class:`PackProcesses`, before its row threads
start: up in milliseconds, torch and the packing code already imported. A process started as a program of its own
(:mod:`hsextract.extract.pack_worker`) imports torch, seconds of CPU: only one that cannot be forked, or one in place of a
process that died (the run's threads are mid-row by then, and a fork copies whatever locks they hold), starts so.

A row first waits for a turn: the run has one for each job its processes hold and ``ROWS_PACKED_ON_THREADS`` more
(:mod:`hsextract.extract.row_worker` says why). When no process has room (all full, or a replacement still starting)
the row is packed on its own thread. Wide rows (tens of MB) take a turn too: on their threads
at once, their finite checks handed the lock over every 512 KiB among dozens of threads. A process that
dies (killed, out of memory) fails every row it held with
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
#: jobs a process holds at once: the row it packs and the next, sent before the first's answer is read, so that it
#: starts the next row as soon as it answers. With one, it waited for a row thread to take its answer and another to
#: send a job, each a turn of the extractor's interpreter lock: a wide bf16 run's started processes sat idle some 17 %
#: of the phase on an H100's host (bench/results-gpu-e2e-h100-speculators.json, ``session30``)
JOBS_PER_PROCESS = 2


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
    """One pack process (forked, or ``python -m hsextract.extract.pack_worker``) and the socket to it.

    It holds up to :data:`JOBS_PER_PROCESS` jobs: each caller sends its job at once and reads its answer in its turn
    (the process answers in the order the jobs came)."""

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
        self.lent = 0  # jobs lent out to row threads (PackProcesses keeps it, under its lock)
        self._turn = threading.Condition()
        self._sent = self._read = 0  # jobs sent, answers read: each caller reads when _read reaches its job's number
        self._reading = False  # a caller reads its answer (outside the lock)
        self._gone = False  # its socket ended under a job: every job it holds fails
        self._end_lock = threading.Lock()
        self._ended: str | None = None

    def wait_ready(self) -> None:
        """Until it has imported what it needs (EOFError: it died first)."""
        if self.conn.recv() != READY:
            raise EOFError("the pack process did not say it was ready")

    def call(self, job: PackJob) -> tuple[str, Any]:
        """Send ``job``, then wait for the answers to the jobs sent before it, then read its own (EOFError or
        OSError: the process ended, under this job or one before it)."""
        with self._turn:
            if self._gone:
                raise EOFError("it ended under an earlier job")
            number, self._sent = self._sent, self._sent + 1
            try:
                self.conn.send(job)
            except OSError:
                self._went()
                raise
            while self._read != number and not self._gone:
                self._turn.wait()
            if self._gone:
                raise EOFError("it ended under an earlier job")
            self._reading = True
        try:  # outside the lock: the next job is sent while this answer is awaited
            answer: tuple[str, Any] = self.conn.recv()
        except (EOFError, OSError):
            with self._turn:
                self._reading = False
                self._went()
            raise
        with self._turn:
            self._reading = False
            self._read += 1
            self._turn.notify_all()
        return answer

    def _went(self) -> None:
        self._gone = True
        self._turn.notify_all()

    def ended(self) -> str:
        """How it ended, for the error of each row it held (it is waited for once)."""
        with self._end_lock:
            if self._ended is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(5.0)
                with self._turn:  # not under a read of another job's answer (that read ends at the process's end)
                    if self._turn.wait_for(lambda: not self._reading, timeout=5.0):
                        self.conn.close()
                self._ended = f"pack process {self.process.pid} ended (exit code {self.process.returncode})"
            return self._ended

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
    """``processes`` pack processes, lent to the row threads a job at a time, :data:`JOBS_PER_PROCESS` jobs each;
    ``on_up`` is told how many are up (ready for rows) each time that changes: none at first, all within milliseconds.

    Each is forked here (create this on the run's main thread before its row threads start), up in milliseconds with
    torch and the packing code imported. Only one that cannot be forked, and one in place of a process that died, is
    started as a program of its own: it imports torch, 4 CPU-seconds on an H100's host, and four of them at once while
    the rows went held a wide bf16 phase to 0.66 x its forward against 0.71-0.74 x for the forks alone
    (bench/results-gpu-e2e-h100-speculators.json, ``session31``)."""

    def __init__(self, processes: int, fmt: OutputFormat, output: Path, on_up: Callable[[int], None] = lambda up: None) -> None:
        if processes < 1:
            raise ValueError(f"PackProcesses needs at least one process, not {processes}")
        self._count, self._fmt, self._output = processes, fmt, output
        self._slots: queue.SimpleQueue[_Process] = queue.SimpleQueue()  # a process once for each job it can take now
        self._on_up = on_up
        self._lock = threading.Lock()
        self._up = 0  # ready, and not stopped or ended since
        self._live: set[_Process] = set()  # up; a process leaves when it stops or ends
        forked = self._fork_all()
        self._starter = threading.Thread(target=self._start_all, args=(forked,), name="hsextract-pack-start", daemon=True)
        self._starter.start()

    @property
    def jobs(self) -> int:
        """How many jobs the processes the run asked for hold at once."""
        return self._count * JOBS_PER_PROCESS

    @property
    def idle(self) -> int:
        """Processes up and holding no job now."""
        with self._lock:
            return sum(1 for process in self._live if not process.lent)

    def pack(self, job: PackJob) -> Packed | None:
        """Pack one row in a process (its error, if any, is raised here); None when every process holds all the jobs
        it takes, or is still starting: the row's own thread packs it then, so the processes add to the threads."""
        process = self._lend()
        if process is None:
            return None
        try:
            outcome, value = process.call(job)
        except (EOFError, OSError) as exc:
            first = self._lost(process)
            error = PackProcessError(
                f"{process.ended()} while it packed row {job.sample.row} ({type(exc).__name__}); the row is tried again. "
                "If this repeats, look for the out-of-memory killer (dmesg), or set pack_processes 0"
            )
            if first:
                self._replace()
            raise error from None
        self._give_back(process)
        if outcome == "packed":
            assert isinstance(value, Packed)
            return value
        raise value

    def close(self) -> None:
        """End every process (the rows are done: none holds a job)."""
        self._starter.join()
        with self._lock:
            live = list(self._live)
            self._live.clear()
        stop_all(live, on_stopped=lambda: self._count_up(-1))

    def _lend(self) -> _Process | None:
        """A process that takes another job now (its ``lent`` counted), or None; the slots of a process that has
        ended are dropped as they come."""
        while True:
            try:
                process = self._slots.get_nowait()
            except queue.Empty:
                return None
            with self._lock:
                if process in self._live:
                    process.lent += 1
                    return process

    def _give_back(self, process: _Process) -> None:
        with self._lock:
            process.lent -= 1
        self._slots.put(process)

    def _lost(self, process: _Process) -> bool:
        """A job's process ended under it: whether this is the first of its jobs to find it so."""
        with self._lock:
            process.lent -= 1
            first = process in self._live
            self._live.discard(process)
        if first:
            self._count_up(-1)
        return first

    def _count_up(self, change: int) -> None:
        with self._lock:
            self._up += change
            up = self._up
        self._on_up(up)

    def _replace(self) -> None:
        """A new process in place of one that died, started as a program on the calling thread (a fork now would copy
        the locks the run's threads hold); if it cannot start, one fewer."""
        ended = self._bring_up(_Process(self._fmt, self._output))
        if ended is not None:
            log.error("%s before it was ready: packing goes on with one process fewer", ended)

    def _bring_up(self, process: _Process) -> str | None:
        """``process`` lent out once it is ready; how it ended (:meth:`_Process.ended`) if it died first."""
        try:
            process.wait_ready()
        except (EOFError, OSError):
            return process.ended()
        with self._lock:
            self._live.add(process)
        self._count_up(1)
        for _ in range(JOBS_PER_PROCESS):
            self._slots.put(process)
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
        started = [_Process(self._fmt, self._output) for _ in range(self._count - len(forked))]  # importing at once
        for process in forked + started:
            if (ended := self._bring_up(process)) is not None:
                log.warning("%s before it was ready; starting another", ended)
                self._replace()
