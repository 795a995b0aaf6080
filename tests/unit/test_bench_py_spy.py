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


@pytest.mark.parametrize("idle", [False, True])
def test_idle_threads_are_sampled_when_asked(tmp_path: Path, idle: bool) -> None:
    """--profile-idle: py-spy's --idle, so that the rows' threads waiting (on a lock, a socket, a slot) show too."""
    binary = tmp_path / "py-spy"  # stands in for py-spy: writes its arguments as one sample to --output
    binary.write_text(
        "#!/bin/sh\nout=\"\"\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=\"$2\"; args=\"$args;$1\"; shift; done\n"
        'echo "thread (1): MainThread$args 1" > "$out"\n'
    )
    binary.chmod(0o755)
    profiler = py_spy.Profiler(binary, tmp_path / "out", delay_s=0.0, seconds=1.0, idle=idle)
    profiler.pids = {"extractor": 1}
    with profiler.profiling("c") as summaries:
        deadline = time.monotonic() + 10
        while not (tmp_path / "out-py-spy-c-extractor.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    extractor = summaries["extractor"]
    assert extractor["idle_threads_sampled"] is idle
    assert ("--idle" in dict(extractor["inclusive"])) is idle
