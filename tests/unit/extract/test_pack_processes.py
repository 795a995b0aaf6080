"""Packing in processes of their own (extract/pack_processes.py), with real forked and started processes and real
dump files: forked processes are up at once, holding none of the run's files; a row packed in a process
writes the same file as on its own thread; its error comes back whole; a process takes the next row before the last
one's answer is read; with every process full or starting the row is handed back (None); a killed process fails every
row it held with a retried error and one started process takes its place; a SIGTERM to the group does not end them;
close ends every one, asking all before waiting for any."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hsextract.contract.files.dumps import DumpSource, write_dump
from hsextract.contract.states import ErrorReason
from hsextract.errors import DumpError, PackProcessError
from hsextract.extract.checks.dump_checks import DumpExpectation, Expectations
from hsextract.extract.pack_processes import JOBS_PER_PROCESS, PackProcesses, _Process, stop_all
from hsextract.extract.packing import Packed, PackJob, pack_row
from hsextract.output.formats import open_format
from hsextract.output.sample import Sample

AUX, HIDDEN, TOKENS = [1, 3, 4], 8, 12
SOURCE = DumpSource("test", "0", "/models/m", AUX, [a + 1 for a in AUX], final_layer_id=7)
EXPECT = DumpExpectation(AUX, [a + 1 for a in AUX], HIDDEN, "float32", False, model_path="/models/m")


def _job(dump_dir: Path, row: int, sent: list[int] | None = None) -> PackJob:
    """A complete dump of ``row`` (its states seeded by the row) and the job for it; ``sent``: other ids sent."""
    ids = list(range(1, TOKENS + 1))
    torch.manual_seed(row)
    rid = f"hsx-{row:09d}-n{TOKENS}"
    write_dump(dump_dir, rid, torch.tensor(ids), torch.randn(TOKENS, len(AUX), HIDDEN), torch.randn(TOKENS, HIDDEN), SOURCE)
    sent = ids if sent is None else sent
    return PackJob(Sample(row, sent, [1] * len(sent), len(sent)), dump_dir / rid, EXPECT)


def _pack_processes(started: bool = True) -> list[int]:
    """The pids of this process's live pack processes: forked (named ``hsextract-pack``) and, with ``started``, those
    started as ``python -m hsextract.extract.pack_worker``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, _, rest = stat.read_text().partition("(")[2].rpartition(")")
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        state, parent = rest.split()[:2]
        ours = name == "hsextract-pack" or (started and b"hsextract.extract.pack_worker" in cmdline)
        if int(parent) == os.getpid() and state != "Z" and ours:
            pids.append(int(stat.parent.name))
    return pids


def _wait_idle(packer: PackProcesses, count: int) -> None:
    deadline = time.monotonic() + 180  # each imports torch; a loaded CI machine takes seconds
    while packer.idle < count:
        assert time.monotonic() < deadline, f"{count} pack processes did not start"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def packer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackProcesses]:
    out = tmp_path_factory.mktemp("out")
    processes = PackProcesses(2, open_format("specforge", out), out)
    _wait_idle(processes, 2)
    yield processes
    processes.close()


def test_a_row_packed_in_a_process_is_the_file_its_own_thread_writes(packer: PackProcesses, tmp_path: Path) -> None:
    fmt = packer._fmt
    packed = packer.pack(_job(tmp_path, 5))
    assert packed is not None and packed.written is not None
    assert set(packed.seconds) == {"read", "verify", "pack"} and packed.picked_up_after_s is not None  # the row syncs
    assert not (tmp_path / f"hsx-{5:09d}-n{TOKENS}").exists()  # its dump is freed
    on_thread = open_format("specforge", tmp_path / "thread")
    job = _job(tmp_path, 5)
    here = pack_row(on_thread, tmp_path / "thread", job.sample, job.directory, Expectations(EXPECT))
    assert here.written == packed.written  # size and checksum
    assert fmt.sample_path(5).read_bytes() == on_thread.sample_path(5).read_bytes()


def test_a_row_packed_on_a_request_thread_is_the_file_a_process_writes_without_zip_crcs(
    packer: PackProcesses, tmp_path: Path
) -> None:
    """torch keeps its save settings per thread (a ContextVar): the setting made where the format was opened did not
    reach the request threads, which computed every record's CRC32 (a third of a wide row's pack) and wrote other
    bytes than a pack process for the same row."""
    packed = packer.pack(_job(tmp_path, 6))
    on_thread = open_format("specforge", tmp_path / "thread")
    job = _job(tmp_path, 6)
    results: list[Packed] = []
    worker = threading.Thread(
        target=lambda: results.append(pack_row(on_thread, tmp_path / "thread", job.sample, job.directory, Expectations(EXPECT)))
    )
    worker.start()
    worker.join()
    (here,) = results
    assert packed is not None and here.written == packed.written  # size and checksum
    assert packer._fmt.sample_path(6).read_bytes() == on_thread.sample_path(6).read_bytes()
    with zipfile.ZipFile(on_thread.sample_path(6)) as archive:
        assert {info.filename: info.CRC for info in archive.infolist() if info.CRC} == {}


def test_an_error_in_a_process_comes_back_whole_and_the_process_stays(packer: PackProcesses, tmp_path: Path) -> None:
    job = _job(tmp_path, 6, sent=list(range(2, TOKENS + 2)))  # the dump holds other ids than were sent
    with pytest.raises(DumpError, match="differ from the 12 sent") as caught:
        packer.pack(job)
    assert caught.value.reason is ErrorReason.TOKEN_MISMATCH and caught.value.retryable
    assert packer.idle == 2


def test_with_every_process_full_the_row_is_handed_back(packer: PackProcesses, tmp_path: Path) -> None:
    lent = []  # every job each process takes, out, as with other rows
    while (process := packer._lend()) is not None:
        lent.append(process)
    assert len(lent) == packer.jobs == 2 * JOBS_PER_PROCESS
    try:
        assert packer.pack(_job(tmp_path, 7)) is None  # none has room: the row's own thread packs it
        assert (tmp_path / f"hsx-{7:09d}-n{TOKENS}").exists()  # untouched
    finally:
        for process in lent:
            packer._give_back(process)
    assert packer.idle == 2


def _the_process(packer: PackProcesses) -> _Process:
    (process,) = packer._live
    return process


def _two_rows_held(packer: PackProcesses, tmp_path: Path, rows: tuple[int, int]) -> tuple[list[object], list[threading.Thread]]:
    """Two rows sent to ``packer``'s one process, stopped (SIGSTOP) so that it holds both; their outcomes, as they come."""
    process = _the_process(packer)
    os.kill(process.process.pid, signal.SIGSTOP)
    outcomes: list[object] = []

    def pack(row: int) -> None:
        try:
            outcomes.append(packer.pack(_job(tmp_path, row)))
        except PackProcessError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=pack, args=(row,)) for row in rows]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while process._sent < 2:  # both sent: the second did not wait for the first's answer
        assert time.monotonic() < deadline, "the second row was not sent to the process holding the first"
        time.sleep(0.01)
    return outcomes, threads


def test_a_process_takes_the_next_row_before_the_last_ones_answer_is_read(tmp_path: Path) -> None:
    """With one job each, a process that answered waited for a row thread to take the answer and another to send the
    next job, each a turn of the extractor's interpreter lock: 17 % of a wide bf16 run idle on an H100's host."""
    one = PackProcesses(1, open_format("specforge", tmp_path / "out"), tmp_path / "out")
    try:
        _wait_idle(one, 1)
        outcomes, threads = _two_rows_held(one, tmp_path, (20, 21))
        assert one.pack(_job(tmp_path, 22)) is None  # a third: no room, its own thread packs it
        os.kill(_the_process(one).process.pid, signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=60)
        assert len(outcomes) == 2 and all(isinstance(o, Packed) for o in outcomes), outcomes
        assert one._fmt.sample_path(20).exists() and one._fmt.sample_path(21).exists()
        assert one.idle == 1
    finally:
        one.close()


def test_a_process_killed_holding_two_rows_fails_both_and_one_process_takes_its_place(tmp_path: Path) -> None:
    before = set(_pack_processes())  # the module's packer's
    ups: list[int] = []
    one = PackProcesses(1, open_format("specforge", tmp_path / "out"), tmp_path / "out", ups.append)
    try:
        _wait_idle(one, 1)
        outcomes, threads = _two_rows_held(one, tmp_path, (23, 24))
        victim = _the_process(one).process.pid
        os.kill(victim, signal.SIGKILL)
        for thread in threads:
            thread.join(timeout=120)
        assert len(outcomes) == 2 and all(isinstance(o, PackProcessError) for o in outcomes), outcomes
        assert {str(o).split(" while")[0] for o in outcomes} == {f"pack process {victim} ended (exit code -9)"}
        assert ups[-2:] == [0, 1] and ups.count(0) == 1  # it ended once, and one replacement is up
        assert len(set(_pack_processes()) - before) == 1
        assert one.pack(_job(tmp_path, 25)) is not None
    finally:
        one.close()


def test_close_right_after_the_start_ends_every_process(tmp_path: Path) -> None:
    before = _pack_processes()  # the module's packer's
    PackProcesses(2, open_format("specforge", tmp_path / "out"), tmp_path / "out").close()
    assert sorted(_pack_processes()) == sorted(before)


def test_a_killed_process_fails_its_row_retried_and_another_takes_its_place(packer: PackProcesses, tmp_path: Path) -> None:
    victim = _pack_processes()[0]
    os.kill(victim, signal.SIGKILL)
    outcomes: list[object] = []
    for row in range(8, 8 + packer.jobs):  # the queue hands out every process's room in turn: the dead one's among it
        try:
            outcomes.append(packer.pack(_job(tmp_path, row)))
        except PackProcessError as exc:
            assert exc.retryable and exc.reason is ErrorReason.PACK_PROCESS_ENDED
            assert f"pack process {victim} ended (exit code -9) while it packed row {row}" in str(exc)
            outcomes.append(exc)
    assert sum(isinstance(o, PackProcessError) for o in outcomes) == 1
    assert packer.idle == 2 and len(_pack_processes()) == 2  # the replacement started before the error went on
    assert len(_pack_processes(started=False)) == 1  # as a program: a fork now would copy the row threads' locks
    assert packer.pack(_job(tmp_path, 100)) is not None


def test_a_sigterm_to_the_group_does_not_end_a_process(packer: PackProcesses, tmp_path: Path) -> None:
    """A service manager's stop signals every process of the unit; the run ends its processes itself."""
    processes = _pack_processes()
    assert len(processes) == 2
    for pid in processes:
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    assert sorted(_pack_processes()) == sorted(processes)
    assert packer.pack(_job(tmp_path, 11)) is not None and packer.pack(_job(tmp_path, 12)) is not None


def test_how_many_are_up_is_told_as_they_start_end_and_are_replaced(tmp_path: Path) -> None:
    """The run's ``hsextract_pack_processes_up``: a replacement packs nothing while it starts (seconds: it imports
    torch), and the benchmark times a run's pace from when every one was up."""
    before = set(_pack_processes())  # the module's packer's
    ups: list[int] = []
    one = PackProcesses(1, open_format("specforge", tmp_path / "out"), tmp_path / "out", ups.append)
    try:
        _wait_idle(one, 1)
        assert ups == [1]
        (pid,) = set(_pack_processes()) - before
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(PackProcessError):
            one.pack(_job(tmp_path, 13))
        assert ups == [1, 0, 1]  # it ended, and its replacement is up
    finally:
        one.close()
    assert ups == [1, 0, 1, 0]


def test_every_process_is_asked_to_stop_before_any_is_waited_for(tmp_path: Path) -> None:
    """One after another, each waited for its teardown in turn: a run's last seconds. Here the first cannot exit
    (stopped) until the others have: asked one after another, they would still be running."""
    fmt = open_format("specforge", tmp_path / "out")
    processes = [_Process(fmt, tmp_path / "out") for _ in range(3)]
    for process in processes:
        process.wait_ready()
    first, *others = processes
    os.kill(first.process.pid, signal.SIGSTOP)
    stopping = threading.Thread(target=stop_all, args=(processes,))
    stopping.start()
    try:
        deadline = time.monotonic() + 60
        while any(p.process.poll() is None for p in others):
            assert time.monotonic() < deadline, "the others were not asked to stop while the first one hung"
            time.sleep(0.05)
        assert first.process.poll() is None and stopping.is_alive()
    finally:
        os.kill(first.process.pid, signal.SIGCONT)
        stopping.join(timeout=60)
    assert [p.process.returncode for p in processes] == [0, 0, 0]


def test_forked_processes_are_up_at_once_holding_none_of_the_runs_files(tmp_path: Path) -> None:
    """A new interpreter imported torch for 1.5-2.5 s (4 CPU-seconds) on an H100's host while a wide run wrote little:
    the run's processes are forks. A fork copies every fd: a child that kept the run's output lock (flock: held while
    any copy is open) or its metrics port would hold them past the run."""
    lock_path = tmp_path / "lock"
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    port = socket.create_server(("127.0.0.1", 0))
    before = set(_pack_processes())
    two = PackProcesses(2, open_format("specforge", tmp_path / "out"), tmp_path / "out")
    try:
        forked = set(_pack_processes()) - before
        assert len(forked) == 2 and forked <= set(_pack_processes(started=False))  # named hsextract-pack: forked
        _wait_idle(two, 2)
        for pid in forked:
            fds = {int(fd.name): os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
            assert sorted(fds)[:3] == [0, 1, 2] and len(fds) == 4, fds  # stdio and its socket
            assert fds[max(fds)].startswith("socket:")
        os.close(held)  # the run lets go of its lock: no child holds it on
        again = os.open(lock_path, os.O_RDWR)
        try:
            fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(again)
        assert two.pack(_job(tmp_path, 14)) is not None and two.pack(_job(tmp_path, 16)) is not None
        assert set(_pack_processes()) - before == forked  # none started besides
    finally:
        two.close()
        port.close()
    assert sorted(_pack_processes()) == sorted(before)


def test_a_process_that_cannot_be_forked_is_started_as_a_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before, forked_before = set(_pack_processes()), set(_pack_processes(started=False))
    monkeypatch.setattr(os, "fork", no_fork)
    one = PackProcesses(1, open_format("specforge", tmp_path / "out"), tmp_path / "out")
    monkeypatch.undo()
    try:
        _wait_idle(one, 1)
        assert len(set(_pack_processes()) - before) == 1 and set(_pack_processes(started=False)) == forked_before
        assert one.pack(_job(tmp_path, 15)) is not None
    finally:
        one.close()


def test_a_forked_process_writes_faulthandlers_tracebacks_to_its_stderr_not_a_closed_file(tmp_path: Path) -> None:
    """A hang is looked into with faulthandler on SIGUSR1 (a file of the run's): in a forked process that file's fd
    is closed, and a new file may have its number. The traceback goes to the process's stderr instead."""
    script = f"""
import faulthandler, os, signal, sys, time
from pathlib import Path
from hsextract.extract.pack_processes import PackProcesses
from hsextract.output.formats import open_format
trace = open({str(tmp_path / "trace.txt")!r}, "w")
faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True)
out = Path({str(tmp_path / "out")!r})
packer = PackProcesses(1, open_format("specforge", out), out)
while packer.idle < 1:
    time.sleep(0.01)
children = Path(f"/proc/{{os.getpid()}}/task/{{os.getpid()}}/children").read_text().split()
(pid,) = [int(c) for c in children if Path(f"/proc/{{c}}/comm").read_text().strip() == "hsextract-pack"]
os.kill(pid, signal.SIGUSR1)
time.sleep(1.0)
packer.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stderr and "pack_worker.py" in done.stderr  # the child's stack, on its stderr
    assert (tmp_path / "trace.txt").read_text() == ""  # nothing into the run's file, or a file with its number


def test_a_forked_process_drops_the_runs_log_file_whose_fd_a_sample_file_takes(tmp_path: Path) -> None:
    """A caller's log file (a FileHandler) had its fd closed in the child, and the next file the child opened, a sample
    file, took that number: a warning logged while it packed went into the sample file."""
    script = f"""
import logging, os, socket, sys
logging.getLogger().addHandler(logging.FileHandler({str(tmp_path / "run.log")!r}))  # the lowest free fd: 3
from hsextract.extract.pack_worker import _leave_the_parent
here, there = socket.socketpair()
pid = os.fork()
if pid == 0:
    _leave_the_parent(there.fileno())
    with open({str(tmp_path / "sample")!r}, "w") as sample:  # fd 3 again: closed above
        logging.getLogger("hsextract.test").warning("a warning while packing")
        sample.write("the sample")
    sys.stderr.flush()
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sample").read_text() == "the sample"
    assert "a warning while packing" in done.stderr  # logging's last resort, in the child
    assert (tmp_path / "run.log").read_text() == ""
