"""A power cut during and right after ``hsextract pipeline`` (regenerate -> prepare -> extract -> verify), on a
filesystem that drops what was not synced: mid-regenerate, mid-extract (also with the small bookkeeping files
written back before the samples) and right after the pipeline said it was complete. Then the same command
again: it must print PIPELINE COMPLETE, and every step's output must equal an uninterrupted pipeline's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hsextract.dev.sample_data import make_sample_conversations

from ..faults.helpers import assert_same_output, samples_written, wait_for
from ..regen_server import FakeSGLang
from .helpers import LossyMount

ROOT = Path(__file__).resolve().parents[2]
ROWS = 24
BOOKKEEPING_BYTES = 8192
#: what names the steps' own paths, which differ between the reference and the run on the lossy filesystem
PATH_FIELDS = (
    "dataset",
    "dataset_preparation.settings.input_path",
    "sources.prepare.settings.input_path",
    "sources.prepare.output",
    "sources.regenerate.output",
)


def _write_config(work: Path, fake: FakeSGLang, server_url: str, conversations: Path, model: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    config = {
        "regenerate": {"server": fake.url, "dataset": str(conversations), "output": "regen.jsonl", "max_new_tokens": 8,
                       "concurrency": 4, "progress": False},
        "prepare": {"model": str(model), "output": "prepared", "progress": False, "specforge_template": "qwen"},
        # one request in flight: both runs batch alike, so their samples are equal byte for byte
        "extract": {"server": server_url, "output": "out", "health_timeout_s": 30, "concurrency": 1},
    }  # fmt: skip
    path = work / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _command(config: Path) -> list[str]:
    return [sys.executable, "-m", "hsextract", "pipeline", "--config", str(config)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "extractor")}


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(config), env=_env(), capture_output=True, text=True, timeout=300)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _journal_rows(work: Path) -> int:
    journal = work / "regen.jsonl.journal" / "rows.jsonl"
    return journal.read_bytes().count(b"\n") if journal.exists() else 0


def _assert_same_pipeline(work: Path, reference: Path) -> None:
    assert _lines(work / "regen.jsonl") == _lines(reference / "regen.jsonl")
    assert_same_output(work / "out", reference / "out", ignore=PATH_FIELDS)


@pytest.mark.parametrize("when", ["mid_regenerate", "mid_extract", "bookkeeping_first", "after_the_run"])
def test_the_same_pipeline_command_recovers_every_step(  # type: ignore[no-untyped-def]
    fake: FakeSGLang, chat_model: Path, server_process, lossy: LossyMount, tmp_path: Path, when: str
) -> None:
    server = server_process(chat_model)
    conversations = make_sample_conversations(tmp_path / "conversations.jsonl", ROWS, 17)
    reference = tmp_path / "reference"
    done = _run(_write_config(reference, fake, server.url, conversations, chat_model))
    assert done.returncode == 0, done.stderr[-3000:]
    work = lossy.path / "work"
    config = _write_config(work, fake, server.url, conversations, chat_model)
    lossy.persist_all()  # the config file was there long before the cut
    if when == "after_the_run":
        done = _run(config)
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        if when == "mid_regenerate":
            fake.delay_s = 0.05
        process = subprocess.Popen(_command(config), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   text=True)  # fmt: skip
        if when == "mid_regenerate":
            wait_for(lambda: _journal_rows(work) >= 5, what="5 regenerated rows", process=process)
        else:
            wait_for(lambda: samples_written(work / "out") >= 8, what="8 samples", process=process)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        fake.delay_s = 0.0
        if when == "bookkeeping_first":
            lossy.persist(BOOKKEEPING_BYTES)
    lost = lossy.stats()
    lossy.cut()
    if when == "after_the_run":  # a pipeline that said it was complete left every step's output on the disk
        _assert_same_pipeline(work, reference)
    again = _run(config)
    assert again.returncode == 0, f"after a cut that dropped {lost}: {again.stderr[-3000:]}"
    assert "PIPELINE COMPLETE" in again.stdout
    _assert_same_pipeline(work, reference)
    if when == "after_the_run":  # every step was complete: nothing redone
        assert "regenerate already complete" in again.stderr and "extract already complete" in again.stderr
