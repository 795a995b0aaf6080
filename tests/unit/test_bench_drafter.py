"""bench_gpu_drafter's CPU-side pieces: the split by source file, the conversations, and the verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_gpu_drafter as bench
import drafter_target as target


def test_the_split_is_by_file_and_stable() -> None:
    sources = [target.Source(f"pkg/mod{i}.py", "x = 1\n" * 40) for i in range(200)]
    held = {s.path for s in sources if target.is_heldout(s, 10)}
    assert held == {s.path for s in sources if target.is_heldout(s, 10)}  # same on every call
    assert 5 < len(held) < 40
    train_rows = target.code_conversations([s for s in sources if s.path not in held], 16, 8)
    held_rows = target.code_conversations([s for s in sources if s.path in held], 16, 8)
    assert not {r["source"] for r in train_rows} & {r["source"] for r in held_rows}


def test_a_conversation_is_a_chunk_then_what_follows_it() -> None:
    text = "\n".join(f"line_{i} = {i}" for i in range(30))
    (row,) = target.code_conversations([target.Source("a.py", text)], 4, 2)[:1]
    user, answer = (turn["value"] for turn in row["conversations"])
    assert user.endswith("line_3 = 3") and "line_0 = 0" in user and answer == "line_4 = 4\nline_5 = 5"


def _evaluation(**tau: float) -> dict:
    return {"drafters": {name: {"expected_acceptance_length": value} for name, value in tau.items()}}


def test_the_verdict_passes_only_clear_wins() -> None:
    good = _evaluation(
        prompt_lookup=1.5,
        speculators_bf16=2.4,
        speculators_fp8=2.35,
        specforge_bf16=2.2,
        speculators_layer_off=1.4,
        speculators_shifted=1.1,
    )
    verdict = bench.verdict(good)
    assert verdict["all_passed"] and verdict["checks"]["fp8_vs_bf16"]["ratio"] == pytest.approx(2.35 / 2.4, abs=1e-3)
    close = dict(good["drafters"], speculators_layer_off={"expected_acceptance_length": 2.0})  # not 1.5x below bf16
    assert not bench.verdict({"drafters": close})["checks"]["speculators_bf16"]["passed"]
    unmeasured = {k: v for k, v in good["drafters"].items() if k != "speculators_shifted"}
    unmeasured["speculators_shifted"] = {"error": "trainer exited 1"}
    assert bench.verdict({"drafters": unmeasured})["wrong_data_best"] == 1.4
    no_fp8 = {k: v for k, v in good["drafters"].items() if k != "speculators_fp8"}
    assert not bench.verdict({"drafters": no_fp8})["all_passed"]  # a drafter not measured is not a pass
