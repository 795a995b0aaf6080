"""The pack process's side (:mod:`hsextract.extract.pack_processes`): forked from the run's process, or started as
``python -m hsextract.extract.pack_worker FD``.

A run's processes are forked (:func:`fork_serving`, on its main thread before its row threads start): the child has
torch and the packing code already imported, so it is up in milliseconds, where a new interpreter took 1.5-2.5 s (4
CPU-seconds) on an H100's host and a wide bf16 run wrote little meanwhile (issue 37). Only then: later the run's threads
are mid-request and mid-row, and a fork copies whatever locks they hold, so a process in place of one that died is
started as a program. Neither is ``multiprocessing``'s spawn, which imports the parent's main module again: a
script that runs an extraction without an ``if __name__ == "__main__"`` guard would start another run in every child.

FD is this process's end of a socket pair. The first message is the output format and the output directory; then
each message is a :class:`~hsextract.extract.packing.PackJob` (the next may come before the last is answered), answered
in order ``("packed", Packed)`` (the sample file written; the row's thread syncs it) or ``("error", exception)``, until
None or the pipe's end. Then it exits at once, without the interpreter's teardown (0.6 s with torch loaded on the CI
machine; four processes ended one after another took a run's last 2.6 s on an H100's host): each sample file is closed
before its answer is sent, so nothing it holds needs that teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import logging
import os
import pickle
import signal
import sys
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import Any

import torch

from hsextract.errors import HsextractError
from hsextract.extract.checks.dump_checks import Expectations
from hsextract.extract.packing import pack_row

READY = "ready"


def serve(conn: Connection) -> None:
    """Pack each job that comes and answer it."""
    # The run stops its processes itself: a terminal's Ctrl-C or a service manager's SIGTERM to the whole group
    # must not kill a job half done under a run that is still recording rows.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)  # one row at a time per process: the processes are the parallelism
    try:
        fmt, output = conn.recv()
    except EOFError:
        return
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return  # the run's process is gone
        if job is None:
            return
        try:  # the row's thread syncs the file (row_worker): a slow disk's fsync holds no process
            answer: tuple[str, Any] = (
                "packed",
                pack_row(fmt, output, job.sample, job.directory, Expectations(job.expect), sync=False),
            )
        except Exception as exc:  # every error goes back to the row's thread
            answer = ("error", portable(exc))
        conn.send(answer)


def portable(exc: Exception) -> Exception:
    """The error itself when the run handles its kind (ours, an OSError) and it pickles; else a RuntimeError with its
    text and traceback, which would otherwise stay in this process."""
    if isinstance(exc, HsextractError | OSError):
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # anything unpickling raises: sent as text below
            pass
        else:
            return exc
    return RuntimeError(f"in a pack process: {type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}")


def fork_serving(fd: int) -> int:
    """Fork a pack process that serves the socket ``fd`` (see the module's docstring); returns its pid. Called by the
    run's main thread before its row threads start: the threads alive then (the stop watch, the planner, the metrics
    server, a caller's own) hold nothing the child uses, and the child touches only the packing code, already imported
    here, fresh stdio objects and its socket."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else what they buffer now would be written by both processes
    with warnings.catch_warnings():  # Python 3.12 warns of any fork in a process with threads (the reason above)
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _leave_the_parent(fd)
        serve(Connection(fd))
        code = 0
    except BaseException:  # whatever it was, said on stderr; never back into the parent's stack
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _leave_the_parent(fd: int) -> None:
    """In a forked child: let go of what belongs to the run's process."""
    gc.freeze()  # the parent's objects are never scanned here, so their pages stay shared, not copied
    _name_this_process(b"hsextract-pack")
    # the run's lock files (flock: held while any copy of the fd is open), its metrics port, its HTTP connections;
    # listed, not os.closerange: without the close_range call that would be one close per possible fd
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) != fd:
                with contextlib.suppress(OSError):  # the listing's own fd, closed already
                    os.close(int(name))
    # new stdio objects: another thread may have held the old ones' buffer locks at the fork, held here for ever
    old = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - this process's stdout until os._exit
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115 - likewise
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    # handlers to stdout and stderr go on, to the new objects; any other (a caller's log file, socket, queue) wrote to
    # an fd closed above, whose number the next sample file opened here takes, and its records would go into that file:
    # dropped, and warnings reach stderr through logging's last resort
    for logger in loggers:
        kept: list[logging.Handler] = []
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
                # assigned, not setStream: that flushes the old stream, under its lock
                handler.stream = getattr(sys, old[id(handler.stream)])
                kept.append(handler)
        logger.handlers = kept  # assigned: removeHandler takes the module's lock
    _faulthandler_to_stderr()


def _faulthandler_to_stderr() -> None:
    """faulthandler's tracebacks (a hang looked into with ``faulthandler.register(SIGUSR1, file=...)``) to this
    process's stderr: the file the run gave it was closed above, and its number may be a sample file's by now."""
    if faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
    for signum in signal.valid_signals():
        try:
            registered = faulthandler.unregister(signum)  # type: ignore[func-returns-value]  # True if it was (typeshed: None)
        except (RuntimeError, ValueError, OSError):  # a signal faulthandler cannot take (SIGSEGV: enable's)
            continue
        if registered:
            faulthandler.register(signum, file=sys.stderr, all_threads=True)


def _name_this_process(name: bytes) -> None:
    """``ps``, ``top`` and ``pgrep`` show the pack processes by this name, not as more copies of the run's command."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux: the name stays
        _LIBC.prctl(15, name, 0, 0, 0)  # type: ignore[union-attr]  # PR_SET_NAME; None (no libc) raises AttributeError


try:  # loaded here, not in the child: a fork copies whatever lock another thread's loading held
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
