"""A power cut during and right after ``hsextract regenerate``, on a filesystem that drops what was not
synced (with the small files written back first, too): the same command again gives every row once, the
same rows as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hsextract.dev.sample_data import make_sample_conversations

from ..regen_server import FakeSGLang
from .helpers import LossyMount

ROOT = Path(__file__).resolve().parents[2]
ROWS = 24
BOOKKEEPING_BYTES = 8192


def _command(fake: FakeSGLang, dataset: Path, output: Path) -> list[str]:
    return [sys.executable, "-m", "hsextract", "regenerate", "--server", fake.url, "--dataset", str(dataset),
            "--output", str(output), "--concurrency", "4", "--no-progress"]  # fmt: skip


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("when", ["mid_run", "after_the_run", "bookkeeping_first"])
def test_the_same_command_gives_every_row_once(fake: FakeSGLang, lossy: LossyMount, tmp_path: Path, when: str) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", ROWS, 11)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "extractor")}
    reference = tmp_path / "reference.jsonl"
    assert subprocess.run(_command(fake, dataset, reference), env=env, capture_output=True, timeout=120).returncode == 0
    output = lossy.path / "out.jsonl"
    if when == "after_the_run":
        done = subprocess.run(_command(fake, dataset, output), env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    else:
        fake.delay_s = 0.05
        process = subprocess.Popen(_command(fake, dataset, output), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        journal = lossy.path / "out.jsonl.journal" / "rows.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not journal.exists() or journal.read_bytes().count(b"\n") < 5):
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        fake.delay_s = 0.0
        if when == "bookkeeping_first":
            lossy.persist(BOOKKEEPING_BYTES)
    lossy.cut()
    if when == "after_the_run":  # a run that said it was done left all of it on the disk
        assert _lines(output) == _lines(reference)
    again = subprocess.run(_command(fake, dataset, output), env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _lines(output) == _lines(reference)
