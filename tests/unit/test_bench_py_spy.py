"""bench/py_spy.py: py-spy's raw samples summarised per thread and function; a missing binary stops the benchmark
before any work; a phase shorter than the profile's delay says it was not profiled."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import py_spy

# py-spy record --format raw --threads: "thread (tid): name;frame;...;frame count"
RAW = """\
thread (11): hsextract-scheduler;Thread.run (threading.py:982);Engine._step (engine.py:269);Linear.forward (linear.py:134) 6
thread (11): hsextract-scheduler;Thread.run (threading.py:982);Engine._step (engine.py:269) 2
thread (12): hsextract-req_3;Thread.run (threading.py:982);sync_file (hsextract/durable/sync.py:46) 1
thread (13): hsextract-req_17;Thread.run (threading.py:982);sync_file (hsextract/durable/sync.py:46) 1
"""


def test_samples_are_shared_out_per_thread_pool_and_function(tmp_path: Path) -> None:
    raw = tmp_path / "e2e-py-spy-c-server.txt"
    raw.write_text(RAW)
    summary = py_spy.summarize(raw)
    assert summary["samples"] == 10 and summary["raw"] == raw.name
    assert summary["threads"] == [["hsextract-scheduler", 0.8], ["hsextract-req", 0.2]]  # a pool's threads together
    assert summary["self"] == [
        ["Linear.forward (linear.py:134)", 0.6],
        ["Engine._step (engine.py:269)", 0.2],
        ["sync_file (hsextract/durable/sync.py:46)", 0.2],
    ]
    inclusive = dict(summary["inclusive"])
    assert inclusive["Thread.run (threading.py:982)"] == 1.0
    assert inclusive["Engine._step (engine.py:269)"] == 0.8


def test_a_missing_binary_is_named_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--py-spy .*nope: no such executable"):
        py_spy.find_py_spy(str(tmp_path / "nope"))


def test_a_phase_over_before_the_delay_is_marked_not_profiled(tmp_path: Path) -> None:
    profiler = py_spy.Profiler(Path(sys.executable), tmp_path / "out", delay_s=30.0, seconds=1.0)
    profiler.pids = {"extractor": 1}
    with profiler.profiling("c") as summaries:
        pass
    assert summaries == {"not_profiled": "the phase ended within its first 30.0 s (--profile-delay-s)"}
    assert not list(tmp_path.iterdir())


def _stand_in(tmp_path: Path) -> Path:
    """Stands in for py-spy: writes its arguments as one sample to --output."""
    binary = tmp_path / "py-spy"
    binary.write_text(
        '#!/bin/sh\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = --output ] && out="$2"; args="$args;$1"; shift; done\n'
        'echo "thread (1): MainThread$args 1" > "$out"\n'
    )
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("idle", [False, True])
def test_idle_threads_are_sampled_when_asked(tmp_path: Path, idle: bool) -> None:
    """--profile-idle: py-spy's --idle, so that the rows' threads waiting (on a lock, a socket, a slot) show too."""
    binary = _stand_in(tmp_path)
    profiler = py_spy.Profiler(binary, tmp_path / "out", delay_s=0.0, seconds=1.0, idle=idle)
    profiler.pids = {"extractor": 1}
    with profiler.profiling("c") as summaries:
        deadline = time.monotonic() + 10
        while not (tmp_path / "out-py-spy-c-extractor.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    extractor = summaries["extractor"]
    assert extractor["idle_threads_sampled"] is idle
    assert ("--idle" in dict(extractor["inclusive"])) is idle


# py-spy record --subprocesses: each stack starts with its process and the ones above it
RAW_SUBPROCESSES = """\
process 50:"python bench.py";thread (50): MainThread;Extraction.run (run.py:177) 3
process 50:"python bench.py";process 61:"python pack_worker 11";thread (61): MainThread;serve (w.py:50);all_finite (f.py:41) 4
process 50:"python bench.py";process 62:"python pack_worker 12";thread (62): MainThread;serve (w.py:50);write (s.py:90) 2
process 50:"python bench.py";process 62:"python pack_worker 12";thread (62): MainThread;serve (w.py:50) 1
"""


def test_a_profile_of_subprocesses_is_summarised_apart_for_the_process_and_its_children(tmp_path: Path) -> None:
    raw = tmp_path / "e2e-py-spy-c-extractor.txt"
    raw.write_text(RAW_SUBPROCESSES)
    own = py_spy.summarize(raw, processes="own")
    assert own["samples"] == 3 and own["threads"] == [["MainThread", 1.0]]
    assert own["self"] == [["Extraction.run (run.py:177)", 1.0]] and "processes" not in own
    children = py_spy.summarize(raw, processes="children")
    assert children["samples"] == 7 and children["processes"] == 2
    assert children["self"] == [["all_finite (f.py:41)", 0.5714], ["write (s.py:90)", 0.2857], ["serve (w.py:50)", 0.1429]]
    assert py_spy.summarize(raw)["samples"] == 10  # all of them, as a profile without children


@pytest.mark.parametrize("native", [False, True])
def test_children_and_native_frames_are_sampled_when_asked(tmp_path: Path, native: bool) -> None:
    """The extractor with its pack processes (--subprocesses); --profile-native: py-spy's --native, which it takes only
    without --nonblocking. The server is profiled alone."""
    binary = _stand_in(tmp_path)
    profiler = py_spy.Profiler(binary, tmp_path / "out", 0.0, 1.0, children=frozenset({"extractor"}), native=native)
    profiler.pids = {"extractor": 1, "server": 2}
    with profiler.profiling("c") as summaries:
        deadline = time.monotonic() + 10
        while len(list(tmp_path.glob("out-py-spy-c-*.txt"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    extractor, server = (dict(summaries[side]["inclusive"]) for side in ("extractor", "server"))
    assert "--subprocesses" in extractor and "--subprocesses" not in server
    for args in (extractor, server):
        assert ("--native" in args, "--nonblocking" in args) == (native, not native)
    assert summaries["extractor_children"]["samples"] == 0 and summaries["extractor"]["native_frames"] is native


@pytest.mark.parametrize(
    ("script", "said"), [("kill -SEGV $$", "SIGSEGV: nothing on stderr"), ("echo no >&2; exit 3", "status 3: no")]
)
def test_a_py_spy_that_wrote_nothing_is_reported_with_how_it_ended(tmp_path: Path, script: str, said: str) -> None:
    """On one H100's host, py-spy --native --subprocesses on the extractor left no profile and an empty stderr: the
    summary said only ``error: ""``. Now it names the exit status or the signal too."""
    binary, ran = tmp_path / "py-spy", tmp_path / "ran"
    binary.write_text(f"#!/bin/sh\ntouch {ran}\n{script}\n")
    binary.chmod(0o755)
    profiler = py_spy.Profiler(binary, tmp_path / "out", delay_s=0.0, seconds=1.0)
    profiler.pids = {"extractor": 1}
    with profiler.profiling("c") as summaries:
        deadline = time.monotonic() + 10
        while not ran.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert summaries["extractor"] == {"error": f"py-spy exited with {said}"}
