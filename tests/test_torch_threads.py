"""The extractor's own torch work runs on one intra-op thread (extract/torch_threads.py says why)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from hsextract.output.formats.specforge import SpecForgeFormat

from .helpers import run_extraction


def test_rows_are_packed_with_one_torch_thread_and_the_setting_is_restored(
    model_dir, start_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start_server(model_dir("llama"))
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps({"input_ids": list(range(1, 20 + row))}) + "\n" for row in range(12)))
    seen: list[tuple[str, int]] = []
    real = SpecForgeFormat.write_sample

    def write_sample(self: SpecForgeFormat, *args: object, **kwargs: object) -> object:
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SpecForgeFormat, "write_sample", write_sample)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a machine with more than one core, as every GPU host is
    try:
        summary = run_extraction(server.url, dataset, tmp_path / "out", pack_processes=0)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert summary.status == "complete" and len(seen) == 12
    assert {threads for _, threads in seen} == {1}, seen  # on the request threads, where the rows are packed
    assert all(name != threading.current_thread().name for name, _ in seen)
    assert after == 2
