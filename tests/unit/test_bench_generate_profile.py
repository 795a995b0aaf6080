"""bench_generate: --profile counts the decode thread's operators per step (it is not the profiling thread); greedy_agreement;
the --decode variants."""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_generate as bench


def test_a_running_threads_operators_are_counted_per_step_and_tabled(tmp_path: Path) -> None:
    todo: queue.Queue[int] = queue.Queue()
    done: queue.Queue[int] = queue.Queue()

    def decode_thread() -> None:  # started before the profiler, as the server's decode thread is
        while (steps := todo.get()) >= 0:
            x = torch.ones(8, 8)
            for _ in range(steps):
                x = torch.mm(x, x) / 8
            done.put(steps)

    thread = threading.Thread(target=decode_thread, daemon=True)
    thread.start()
    args = argparse.Namespace(profile=tmp_path / "prof", device="cpu")
    into: dict[str, Any] = {}
    with bench.profiled(args, "server-4", lambda: 4, into):
        todo.put(4)
        done.get()
    todo.put(-1)
    profile = into["profile"]
    assert profile["steps"] == 4
    assert profile["aten_ops_per_step"] >= 2  # an mm and a div a step, at least: recorded on the other thread
    assert profile["launches_per_step"] == 0 and profile["syncs_per_step"] == 0  # no device here
    assert "aten::mm" in (tmp_path / "prof" / "server-4.txt").read_text()

    untouched: dict[str, Any] = {}
    with bench.profiled(argparse.Namespace(profile=None, device="cpu"), "hf-4", lambda: 4, untouched):
        torch.ones(2) * 2
    assert untouched == {}


def test_greedy_agreement_counts_equal_sequences_and_the_tokens_before_the_first_difference() -> None:
    reference = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    tokens = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9, 9, 9]]  # equal; differs at its third token; at its first
    agreement = bench.greedy_agreement(tokens, reference)
    assert agreement == {"sequences_equal": 1 / 3, "tokens_before_first_difference": (1 + 2 / 4 + 0) / 3}
    assert bench.greedy_agreement(reference, reference) == {"sequences_equal": 1.0, "tokens_before_first_difference": 1.0}


def test_each_decode_variant_configures_the_layout_it_names(tmp_path: Path) -> None:
    """The variants name the layout whatever the server's defaults are (they changed: the static layout with graphs)."""
    from hsextract.capture.embedded.config import ServeConfig

    def layout(variant: str) -> tuple[str, bool]:
        config = ServeConfig(model=tmp_path, dump_dir=tmp_path, **bench.DECODE_VARIANTS[variant])
        return config.decode_kv, config.decode_graphs

    assert layout("dynamic") == ("dynamic", False)
    assert layout("static") == ("static", False)
    default = ServeConfig(model=tmp_path, dump_dir=tmp_path)
    assert layout("graphs") == ("static", True) == (default.decode_kv, default.decode_graphs)
