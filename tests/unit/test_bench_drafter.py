"""bench_gpu_drafter's CPU-side pieces: the split by source file, the conversations, and the verdict."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import cast

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_gpu_drafter as bench
import drafter_bundle as bundle
import drafter_curve as curve
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


def test_prose_is_a_files_docstrings_and_comments_in_source_order() -> None:
    text = (
        '"""The module says hello."""\n'
        "# -*- coding: utf-8 -*-\n"
        "import os  # noqa: F401\n"
        "# first comment line\n"
        "def f():\n"
        '    """Return one.\n\n    More words here.\n    """\n'
        "    return 1  # the answer\n"
        "# ----------\n"
    )
    assert target.prose_lines(text) == [
        "The module says hello.", "first comment line", "Return one.", "More words here.", "the answer",
    ]  # fmt: skip
    assert target.prose_lines("def broken(:\n") == []


def test_a_prose_conversation_is_prose_then_the_prose_that_follows() -> None:
    text = "\n".join(f"# comment number {i}" for i in range(13))
    rows = target.prose_conversations([target.Source("m.py", text)], 4, 2)
    assert len(rows) == 2 and all(row["kind"] == "prose" for row in rows)
    user, answer = (turn["value"] for turn in rows[1]["conversations"])
    assert user == "Continue the prose of m.py:\n" + "\n".join(f"comment number {i}" for i in range(6, 10))
    assert answer == "comment number 10\ncomment number 11"


GOOD = {
    "speculators_bf16": {1300: 1.9, 4000: 2.3, 9000: 2.7},
    "specforge_bf16": {1300: 1.8, 4000: 2.2, 9000: 2.5},
    "speculators_fp8": {9000: 2.68},
    "speculators_layer_off": {9000: 2.6},
    "speculators_shifted": {9000: 1.2},
}


def test_the_verdict_passes_only_clear_wins() -> None:
    verdict = curve.verdict({"code": GOOD}, {"code": 2.0})
    code = verdict["kinds"]["code"]
    assert verdict["all_passed"], code
    assert code["best_over_prompt_lookup"] == {"drafter": "speculators_bf16", "ratio": 1.35, "passed": True}
    assert code["fp8_vs_bf16"]["ratios"] == {9000: pytest.approx(2.68 / 2.7, abs=1e-3)}
    assert not curve.verdict({"code": GOOD}, {"code": 2.1})["all_passed"]  # 1.29 x prompt lookup
    flat = dict(GOOD, specforge_bf16={1300: 1.8, 4000: 2.2, 9000: 2.2})
    assert not curve.verdict({"code": flat}, {"code": 2.0})["kinds"]["code"]["rising_with_data"]["specforge_bf16"]["passed"]
    two_sizes = {name: {s: v for s, v in points.items() if s != 4000} for name, points in GOOD.items()}
    assert not curve.verdict({"code": two_sizes}, {"code": 2.0})["all_passed"]  # a curve needs three sizes
    layer_off_as_good = dict(GOOD, speculators_layer_off={9000: 2.7})
    assert not curve.verdict({"code": layer_off_as_good}, {"code": 2.0})["kinds"]["code"]["bf16_over_layer_off"]["passed"]
    no_fp8 = {k: v for k, v in GOOD.items() if k != "speculators_fp8"}
    assert not curve.verdict({"code": no_fp8}, {"code": 2.0})["all_passed"]  # a drafter not measured is not a pass


def test_a_comparison_at_one_size_counts_only_between_drafters_trained_for_the_same_epochs() -> None:
    """Sizes merge across calls: bf16 from a 4-epoch call against layer-off from a 3-epoch one is no comparison."""
    same = {9000: dict.fromkeys(("speculators_bf16", "speculators_fp8", "speculators_layer_off", "speculators_shifted"), 4)}
    assert curve.verdict({"code": GOOD}, {"code": 2.0}, trained_epochs=same)["all_passed"]
    mixed = {9000: {**same[9000], "speculators_layer_off": 3, "speculators_fp8": 3}}
    code = curve.verdict({"code": GOOD}, {"code": 2.0}, trained_epochs=mixed)["kinds"]["code"]
    assert not code["bf16_over_layer_off"]["passed"] and code["bf16_over_layer_off"]["epochs_differ_at"] == [9000]
    assert not code["fp8_vs_bf16"]["passed"] and code["fp8_vs_bf16"]["epochs_differ_at"] == [9000]
    assert code["bf16_over_shifted"]["passed"] and "epochs_differ_at" not in code["bf16_over_shifted"]
    by_size = {1300: {"speculators_bf16": 3}, 4000: {"speculators_bf16": 3}, 9000: {"speculators_bf16": 4}}
    rising = curve.verdict({"code": GOOD}, {"code": 2.0}, trained_epochs=by_size)["kinds"]["code"]["rising_with_data"]
    assert rising["speculators_bf16"]["epochs"] == {1300: 3, 4000: 3, 9000: 4}  # reported beside the curve
    sizes = {"9000": {"train_speculators_bf16": {"epochs": 4, "rc": 0}, "train_specforge_bf16": {"rc": 0}, "evaluation": {}}}
    assert curve.epochs(sizes) == {9000: {"speculators_bf16": 4}}  # a part without its epochs (older calls) is not guessed


def test_the_curve_reads_every_size_and_kind_measured() -> None:
    def tau(value: float) -> dict:
        return {"expected_acceptance_length": value}

    sizes = {
        "4000": {"evaluation": {"code": {"speculators_bf16": tau(2.3)}}},
        "1300": {"evaluation": {"code": {"speculators_bf16": tau(1.9), "specforge_bf16": {"error": "x"}},
                                "prose": {"speculators_bf16": tau(1.4)}}},
    }  # fmt: skip
    expected = {"code": {"speculators_bf16": {1300: 1.9, 4000: 2.3}}, "prose": {"speculators_bf16": {1300: 1.4}}}
    assert curve.curve(sizes) == expected


def test_a_bundle_comes_back_whole_or_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "target").mkdir(parents=True)
    (work / "target" / "model.bin").write_bytes(bytes(range(256)) * 4096)
    (work / "regen.jsonl").write_text('{"a": 1}\n')
    manifest = bundle.save(work, ["target", "regen.jsonl"], tmp_path / "out")
    again = bundle.load(tmp_path / "out", tmp_path / "again")
    assert again == manifest
    assert (tmp_path / "again" / "target" / "model.bin").read_bytes() == (work / "target" / "model.bin").read_bytes()
    part = tmp_path / "out" / manifest["parts"][0]
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(ValueError, match="torn"):
        bundle.load(tmp_path / "out", tmp_path / "third")
    part.unlink()
    with pytest.raises(FileNotFoundError, match="lacks the bundle's parts"):
        bundle.load(tmp_path / "out", tmp_path / "third")


def test_a_bundle_is_cut_into_parts_a_call_can_bring_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "PART_BYTES", 1000)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "noise.bin").write_bytes(os.urandom(5000))
    manifest = bundle.save(tmp_path / "work", ["noise.bin"], tmp_path / "out")
    assert len(manifest["parts"]) >= 5 and all((tmp_path / "out" / p).stat().st_size <= 1000 for p in manifest["parts"])
    assert bundle.load(tmp_path / "out", tmp_path / "back")["sha256"] == manifest["sha256"]


def test_sizes_take_all_and_refuse_nonsense() -> None:
    assert bench.sizes_arg("4000, 1300,all") == [1300, 4000, bench.ALL]
    for bad in ("", "ten", "5"):
        with pytest.raises(argparse.ArgumentTypeError, match="--sizes"):
            bench.sizes_arg(bad)


def test_an_appended_call_must_use_the_same_target(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    first = bench.Results(out, {}, append=False)
    first.target({"sha256": "aaa"})
    second = bench.Results(out, {}, append=True)
    assert len(second.data["calls"]) == 2
    second.target({"sha256": "aaa"})
    with pytest.raises(ValueError, match="bundle-in"):
        bench.Results(out, {}, append=True).target({"sha256": "bbb"})


def test_trainers_past_the_deadline_are_stopped_together_and_each_keeps_its_own_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real processes: one ends at once, three ignore SIGTERM (as speculators inside torch.compile did on the
    H200) and are killed after one shared grace, not one grace each."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    jobs = {"specforge_bf16-100": [sys.executable, "-c", "pass"]}
    jobs.update({f"speculators_bf16-{n}": [sys.executable, "-c", stubborn] for n in (200, 300, 400)})
    monkeypatch.setattr(bench, "training_jobs", lambda args, work, names: (jobs, {name: {} for name in jobs}))
    monkeypatch.setattr(bench, "STOP_GRACE_S", 3.0)
    (tmp_path / "logs").mkdir()
    started = time.perf_counter()
    report = bench.train_all(argparse.Namespace(), tmp_path, list(jobs), deadline_s=2.0)
    wall = time.perf_counter() - started
    quick = report["jobs"]["specforge_bf16-100"]
    assert quick["rc"] == 0 and quick["seconds"] < 2.0 and "stopped_at_deadline_s" not in quick
    for n in (200, 300, 400):
        job = report["jobs"][f"speculators_bf16-{n}"]
        assert job["stopped_at_deadline_s"] == 2 and job["seconds"] == 2.0 and job["rc"] == -9  # no checkpoint: killed
    assert wall < 2.0 + 3 * 3.0, f"each stopped trainer had a grace of its own ({wall:.1f} s)"


def test_outputs_spread_over_the_servers_largest_first_and_layer_off_on_its_own() -> None:
    names = ["specforge_bf16-1300", "speculators_bf16-1300", "specforge_bf16-2600", "speculators_bf16-2600",
             "speculators_fp8-2600", "speculators_layer_off-2600"]  # fmt: skip
    queues = bench.server_queues(names, ["default", "default-2", "layer-off"])
    assert queues == {
        "default": ["specforge_bf16-2600", "speculators_fp8-2600"],
        "default-2": ["speculators_bf16-2600", "specforge_bf16-1300", "speculators_bf16-1300"],
        "layer-off": ["speculators_layer_off-2600"],
    }
    alone = bench.server_queues(names[:4], ["default"])
    assert alone == {"default": ["specforge_bf16-2600", "speculators_bf16-2600", "specforge_bf16-1300", "speculators_bf16-1300"]}


def test_each_output_is_verified_on_its_servers_queue_right_after_its_extraction(tmp_path: Path) -> None:
    """Not all verifies after all extractions, one at a time: on three servers that cost 66 s a call."""
    jobs = {"speculators_bf16-900": ("speculators", "prep-900", []),
            "speculators_fp8-900": ("speculators", "prep-900", ["--storage", "float8_e4m3fn"]),
            "speculators_bf16-300": ("speculators", "prep-300", [])}  # fmt: skip
    queues = bench.server_queues(list(jobs), ["default", "default-2"])
    urls = {"default": "http://a", "default-2": "http://b"}
    commands = bench.queue_commands(queues, urls, tmp_path, jobs, verify=True)
    assert {server: list(queue) for server, queue in commands.items()} == {
        "default": ["extract_speculators_bf16-900", "verify_speculators_bf16-900",
                    "extract_speculators_bf16-300", "verify_speculators_bf16-300"],
        "default-2": ["extract_speculators_fp8-900", "verify_speculators_fp8-900"],
    }  # fmt: skip
    assert commands["default-2"]["verify_speculators_fp8-900"] == ["verify", str(tmp_path / "out-speculators_fp8-900")]
    assert commands["default-2"]["extract_speculators_fp8-900"][:3] == ["extract", "--server", "http://b"]
    unverified = bench.queue_commands(queues, urls, tmp_path, jobs, verify=False)
    assert [name for queue in unverified.values() for name in queue if name.startswith("verify")] == []


def test_serve_args_reach_every_server_last_so_they_override(tmp_path: Path) -> None:
    argv = bench.serve_argv(tmp_path / "m", tmp_path / "d", 4321, "cuda", [2, 4, 5], "--decode-kv static --decode-graphs")
    assert argv[-3:] == ["--decode-kv", "static", "--decode-graphs"]
    assert argv[argv.index("--layer-ids") + 1] == "2,4,5" and argv[argv.index("--port") + 1] == "4321"
    assert bench.serve_argv(tmp_path / "m", tmp_path / "d", 1, "cuda", None, "")[-2:] == ["--max-running-requests", "256"]
    assert bench.parse_args(["--serve-args", "--decode-kv static"]).serve_args == "--decode-kv static"


def test_a_bundles_pool_is_grown_only_when_it_is_this_corpuss_pool(tmp_path: Path) -> None:
    args = bench.parse_args(["--corpus-bytes", "300000", "--sizes", "20", "--pool", "20", "--bundle-in", str(tmp_path)])
    pool = bench.Corpus(args).conversations(0)["train"]
    assert len(pool) > 30
    bench.write_jsonl(tmp_path / "regen-train.jsonl", pool[:20])
    no_server = cast(bench.Server, None)  # neither case reaches the server
    assert bench.extend_pool(args, tmp_path, no_server) == {"rows": 20, "added": 0}

    other = [*pool[:3], pool[25], *pool[4:20]]  # row 3 is not the rebuilt pool's row 3
    bench.write_jsonl(tmp_path / "regen-train.jsonl", other)
    args.pool = 30
    with pytest.raises(ValueError, match=r"pool row 3 .* make a new bundle"):
        bench.extend_pool(args, tmp_path, no_server)
    assert not (tmp_path / "conv-train-more.jsonl").exists()
    assert len(bench.read_jsonl(tmp_path / "regen-train.jsonl")) == 20


def test_a_bundle_holding_the_whole_corpus_is_used_as_it_is(tmp_path: Path) -> None:
    """--sizes all (the default --pool is then "all") on a bundle that holds every train conversation: nothing
    is left to regenerate, so nothing is sent (it ran regenerate on an empty file, which stopped the H200 call)."""
    args = bench.parse_args(["--corpus-bytes", "300000", "--sizes", "all", "--bundle-in", str(tmp_path)])
    pool = bench.Corpus(args).conversations(0)["train"]
    bench.write_jsonl(tmp_path / "regen-train.jsonl", pool)
    no_server = cast(bench.Server, None)  # nothing is regenerated
    assert args.pool > len(pool)
    assert bench.extend_pool(args, tmp_path, no_server) == {"rows": len(pool), "added": 0, "from_bundle": len(pool)}
    assert not (tmp_path / "conv-train-more.jsonl").exists()


def test_a_trainer_stopped_at_the_deadline_reports_how_far_it_got(tmp_path: Path) -> None:
    """speculators 0.9's own lines (from the H200 log of a trainer stopped in its third epoch)."""
    log_path = tmp_path / "train.log"
    log_path.write_text(
        "[15:33:28] INFO     Training epoch 1/3 completed                  trainer.py:739\n"
        "Epoch 1 100% ━━━━━━━━━━━━━━━━━━━━━━━━━━ 421/421  [ 0:00:22 < 0:00:00 , 19 it/s ]\n"
        "[15:33:30] INFO     Training epoch 2/3 completed                  trainer.py:739\n"
        "           INFO     Validation epoch 2/3 completed                trainer.py:756\n"
        "           INFO     Training epoch 3/3 started                    trainer.py:737\n"
        "Epoch 2  64% ━━━━━━━━━━━━━━━━╸          268/421  [ 0:00:15 < 0:00:09 , 17 it/s ]\n"
    )
    assert bench.trainer_progress(log_path)["epochs_done"] == 2.64
    log_path.write_text("Training epoch 3/3 completed\nEpoch 2 100% ━━ 421/421\n")
    assert bench.trainer_progress(log_path)["epochs_done"] == 3

    sizes = {
        "1300": {"train_speculators_bf16": {"rc": 0, "seconds": 90.0}},
        "9000": {"train_speculators_bf16": {"rc": 0, "stopped_at_deadline_s": 239, "epochs_done": 2.64},
                 "train_speculators_fp8": {"rc": 0, "seconds": 200.0}, "extract_speculators_bf16": {"rc": 0}},
    }  # fmt: skip
    stopped = curve.cut_short(sizes)
    assert stopped == {9000: {"speculators_bf16": {"stopped_at_deadline_s": 239, "epochs_done": 2.64}}}
    verdict = curve.verdict({"code": GOOD}, {"code": 2.0}, stopped)
    assert verdict["kinds"]["code"]["cut_short_at_largest"] == stopped[9000]
    assert verdict["all_passed"]  # reported, not judged
