"""Resume: SIGKILL mid-run, rerun the same command, get exactly the uninterrupted output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from hsextract.dev.sample_data import make_sample_data
from hsextract.output.formats import open_format

from .helpers import VOLATILE_FIELDS, run_extraction


def extract_command(url: str, dataset: Path, output: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hsextract",
        "extract",
        "--server",
        url,
        "--dataset",
        str(dataset),
        "--output",
        str(output),
        "--concurrency",
        "2",
        "--max-seq-len",
        "256",
    ]


def comparable(output: Path) -> dict[str, object]:
    config = json.loads((output / "data_config.json").read_text())
    for field in (*VOLATILE_FIELDS, "dataset"):
        config.pop(field, None)
    return {
        "config": config,
        "samples": [
            {k: v for k, v in json.loads(line).items() if k != "bytes"}
            for line in (output / "samples.jsonl").read_text().splitlines()
        ],
        "errors": (output / "errors.jsonl").read_text(),
        "files": sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file()),
    }


def test_resume_after_sigkill_equals_uninterrupted_run(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"), chunked_prefill_size=128)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=24, vocab_size=1024, seed=7, max_len=400)
    with open(dataset, "a") as handle:
        handle.write("{broken\n")
    reference = run_extraction(server.url, dataset, tmp_path / "reference", concurrency=2, max_seq_len=256)
    assert reference.status == "complete"

    output = tmp_path / "resumed"
    process = subprocess.Popen(extract_command(server.url, dataset, output), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        written = output / "samples.jsonl"
        if written.exists() and len(written.read_text().splitlines()) >= 8:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = len((output / "samples.jsonl").read_text().splitlines())
    assert 8 <= partial < 24, f"the kill came too late to test anything ({partial} samples written)"
    assert not (output / "data_config.json").exists()

    rerun = subprocess.run(extract_command(server.url, dataset, output), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert comparable(output) == comparable(tmp_path / "reference")
    reference_format = open_format("specforge", tmp_path / "reference")
    resumed_format = open_format("specforge", output)
    for row in range(24):
        a, b = reference_format.read_sample(row), resumed_format.read_sample(row)
        assert a.loss_mask is not None and b.loss_mask is not None
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        # stored as bfloat16 (SpecForge's dtype): another batching may move a value across one rounding step
        assert torch.allclose(a.aux_hidden_states.float(), b.aux_hidden_states.float(), rtol=2**-7, atol=1e-5)
        assert torch.allclose(a.final_hidden_state.float(), b.final_hidden_state.float(), rtol=2**-7, atol=1e-5)
    assert not [p for p in output.rglob(".*")], "temporary files remain after a finished run"
    assert not any(server.dump_dir.iterdir()), "dumps were left in the dump dir"


def test_rerun_of_a_finished_run_does_nothing(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=4, vocab_size=1024, seed=2, max_len=120)
    first = run_extraction(server.url, dataset, tmp_path / "out")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").rglob("*.ckpt")}
    second = run_extraction(server.url, dataset, tmp_path / "out")
    assert first.written_now == 4 and second.written_now == 0 and second.resumed == 4
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out").rglob("*.ckpt")} == before


def test_sigterm_stops_cleanly_and_resumes(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=20, vocab_size=1024, seed=4, max_len=400)
    output = tmp_path / "out"
    process = subprocess.Popen(
        extract_command(server.url, dataset, output), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (output / "samples.jsonl").exists() and (output / "samples.jsonl").read_text().count("\n") >= 3
    ):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 130, out
    assert json.loads((output / "data_config.json").read_text())["status"] == "interrupted"
    rerun = subprocess.run(extract_command(server.url, dataset, output), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads((output / "data_config.json").read_text())["total_samples"] == 20


_KILLED_IN_SAVE_FILE = """
import sys, torch
from safetensors.torch import save_file
save_file({"x": torch.zeros(64, 1024, 1024)}, sys.argv[1])
"""


def _killed_inside_save_file(target: Path) -> Path:
    """What a run SIGKILLed inside safetensors' save_file leaves: the writer's own temp file beside ``target``."""
    for _ in range(5):  # a loaded machine may let the write finish before the kill: then again
        before = set(target.parent.iterdir())
        process = subprocess.Popen([sys.executable, "-c", _KILLED_IN_SAVE_FILE, str(target)])
        deadline = time.monotonic() + 120
        while not (left := set(target.parent.iterdir()) - before) and time.monotonic() < deadline:
            time.sleep(0.002)
        process.kill()
        process.wait()
        if target.exists():
            target.unlink()
            continue
        assert len(left) == 1, left
        return left.pop()
    raise AssertionError("save_file finished before every kill")


def test_the_rerun_sweeps_the_temp_file_safetensors_leaves_when_killed(model_dir, start_server, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    from hsextract.output.verify import verify_output

    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=4, vocab_size=1024, seed=2, max_len=120)
    out = tmp_path / "out"
    assert run_extraction(server.url, dataset, out, format="speculators").written_now == 4
    stray = _killed_inside_save_file(out / "hidden_states" / ".hs_9.safetensors.tmp-1-2")
    assert stray.name.startswith(".tmp")  # safetensors 0.8: Rust's tempfile crate, then a rename
    assert any("temporary files left" in problem for problem in verify_output(out).problems)
    with caplog.at_level("INFO", logger="hsextract.extract.run"):
        rerun = run_extraction(server.url, dataset, out, format="speculators")
    assert rerun.written_now == 0 and rerun.resumed == 4
    assert not stray.exists() and "removed 1 temporary files left by an interrupted run" in caplog.text
    assert verify_output(out).ok
