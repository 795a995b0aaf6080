"""Greedy regeneration through the embedded server equals transformers' ``generate(do_sample=False)`` on
the same rendered prompt, at concurrency 1 and batched; a seeded sampled run is reproducible.

Needs the embedded server's decoding (``/generate`` with ``max_new_tokens > 0``, branch ``generate``);
until it has it these tests skip, saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry

from hsextract.dev.sample_data import make_sample_conversations
from hsextract.prepare.model_tokenizer import load_model_tokenizer
from hsextract.regen import RegenerateConfig, Regeneration
from hsextract.regen.metrics import RegenMetrics
from hsextract.regen.prompts import Prompter, stop_token_ids

MAX_NEW = 10
_ROLES = {"human": "user", "gpt": "assistant"}


def _server(model_dir: Any, start_server: Any) -> Any:
    model = model_dir("llama", "float32")
    server = start_server(model)
    body = {"input_ids": [1, 2, 3], "rid": "probe", "sampling_params": {"max_new_tokens": 1}}
    answer = httpx.post(server.url + "/generate", json=body, timeout=60)
    if answer.status_code != 200 or "output_ids" not in answer.json():
        pytest.skip(f"the embedded server does not decode yet (HTTP {answer.status_code}: {answer.text[:120]})")
    return model, server


def _regenerate(url: str, dataset: Path, output: Path, **settings: Any) -> list[dict[str, Any]]:
    config = RegenerateConfig(server=url, dataset=dataset, output=output, progress=False, max_new_tokens=MAX_NEW,
                              **settings)
    summary = Regeneration(config, RegenMetrics(CollectorRegistry())).run()
    assert summary.status == "complete", summary
    return [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]


def test_greedy_regeneration_equals_transformers_generate(model_dir: Any, start_server: Any, tmp_path: Path) -> None:
    import transformers

    model_path, server = _server(model_dir, start_server)
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 6, 3)
    given = [json.loads(line) for line in dataset.read_text().splitlines()]
    one = _regenerate(server.url, dataset, tmp_path / "one.jsonl", concurrency=1, turns="last")
    many = _regenerate(server.url, dataset, tmp_path / "many.jsonl", concurrency=6, turns="last")
    assert one == many
    tokenizer = load_model_tokenizer(model_path, None, False)
    stops = stop_token_ids(tokenizer, model_path)
    prompter = Prompter(tokenizer, stops, {})
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for before, after in zip(given, one, strict=True):
        (meta,) = after["regen"]["turns"]
        history = [{"role": _ROLES.get(t["from"], t["from"]), "content": t["value"]}
                   for t in before["conversations"][: meta["turn"]]]
        prompt = prompter.prompt_ids(history, None)
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=stops,
                              pad_token_id=stops[0])
        ids = out[0, len(prompt):].tolist()
        cut = next((k for k, token in enumerate(ids) if token in stops), None)
        if cut is not None:  # transformers pads a batch after its stop; one prompt: nothing after it
            ids = ids[: cut + 1]
        assert after["conversations"][meta["turn"]]["value"] == prompter.decode(ids)
        assert meta["generated_tokens"] == len(ids)
        assert meta["finish_reason"] == ("stop" if ids[-1] in stops else "length")


def test_a_seeded_sampled_run_is_reproducible(model_dir: Any, start_server: Any, tmp_path: Path) -> None:
    _, server = _server(model_dir, start_server)
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 4, 5)
    first = _regenerate(server.url, dataset, tmp_path / "a.jsonl", temperature=1.0, seed=7, concurrency=4)
    again = _regenerate(server.url, dataset, tmp_path / "b.jsonl", temperature=1.0, seed=7, concurrency=1)
    other = _regenerate(server.url, dataset, tmp_path / "c.jsonl.out.jsonl", temperature=1.0, seed=8, concurrency=4)
    assert first == again
    assert [r["conversations"] for r in first] != [r["conversations"] for r in other]
