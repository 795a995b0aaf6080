"""A prepare killed with SIGKILL mid-run, then rerun: every input row written exactly once, as an unbroken run writes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets

from hsextract.dev.sample_data import make_sample_conversations
from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.run import run_prepare

ROWS, CHUNK = 240, 8


def _rows(path: Path) -> list[tuple[int, int, list[int], list[int]]]:
    data = datasets.load_from_disk(str(path))
    return sorted(zip(data["source_row"], data["turn"], data["input_ids"], data["loss_mask"], strict=True))


def test_sigkill_then_rerun(chatml_model: Path, tmp_path: Path) -> None:
    source = make_sample_conversations(tmp_path / "c.jsonl", ROWS, seed=3, style="messages")
    out = tmp_path / "out"
    args = ["--model", str(chatml_model), "--dataset", str(source), "--like", "speculators",
            "--chunk-rows", str(CHUNK), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "hsextract", "prepare", *args, "--output", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "out.partial" / "journal.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and journal.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = journal.read_bytes().count(b"\n")
    assert not out.exists() and 3 <= done < ROWS // CHUNK, "the kill did not land mid-run"

    config = PrepareConfig(model=chatml_model, dataset=source, output=out, like="speculators", chunk_rows=CHUNK,
                           progress=False)
    summary = run_prepare(config)
    assert summary.resumed_rows >= done * CHUNK
    unbroken = tmp_path / "unbroken"
    reference = run_prepare(config.model_copy(update={"output": unbroken}))
    assert _rows(out) == _rows(unbroken)  # each row once, none missing
    assert summary.counts == reference.counts and summary.counts["rows_in"] == ROWS
    assert json.loads((out / "prepare.json").read_text())["counts"]["rows_out"] == reference.counts["rows_out"]
    assert not out.with_name("out.partial").exists()
