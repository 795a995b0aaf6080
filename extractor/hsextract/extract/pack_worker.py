"""The pack process's side (:mod:`hsextract.extract.pack_processes`): ``python -m hsextract.extract.pack_worker FD``.

It is started as a program of its own, not forked or spawned by ``multiprocessing``: a spawned child imports the
parent's main module again, and a script that runs an extraction without an ``if __name__ == "__main__"`` guard
would start another run in every child. FD is this process's end of a socket pair. The first message is the
output format and the output directory; then each message is a :class:`~hsextract.extract.packing.PackJob`,
answered ``("packed", Packed)`` (the sample file written; the row's thread syncs it) or ``("error", exception)``,
until None or the pipe's end. Then it exits at once, without the interpreter's teardown (0.6 s with torch loaded on
the CI machine; four processes ended one after another took a run's last 2.6 s on an H100's host): each sample file
is closed before its answer is sent, so nothing it holds needs that teardown.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
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


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
