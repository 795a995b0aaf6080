"""The spot check against the embedded server: the engine's own hidden states of every Nth row (an
unbatched forward, answered in ``meta_info.hidden_states`` as SGLang does) against its dump.

A run with the check on passes in bfloat16, chunked and batched, in both formats and in FP8; an engine
whose dump path is broken (the aux states taken one layer late, or the final state before the norm) is
caught on the first checked rows, the rows go to errors.jsonl naming the tensor, positions and size,
and the run stops after ``spot_check_max_mismatches``. The broken engines are the real one with one
method of its dump path changed; the spot check's path (``_forward_alone``) is left as it is.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from hsextract.capture.embedded import Engine
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.front import HttpFront
from hsextract.contract.spot_check import SpotCheckAnswer, SpotCheckRequest
from hsextract.contract.states import RunStatus
from hsextract.extract.metrics import ExtractMetrics

from .helpers import RunningServer, run_extraction

LENGTHS = [3, 17, 40, 64, 65, 90, 128, 150, 33, 7]  # most above the chunk of 32


def write_dataset(path: Path, lengths: Sequence[int] = LENGTHS, seed: int = 3) -> Path:
    generator = torch.Generator().manual_seed(seed)
    with open(path, "w") as handle:
        for length in lengths:
            ids = torch.randint(0, 1024, (length,), generator=generator).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [1] * length}) + "\n")
    return path


def spot_checks(metrics: ExtractMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value("hsextract_spot_checks_total", {"result": result})
    return float(value or 0.0)


def errors(output: Path) -> list[dict[str, Any]]:
    path = output / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


class AuxOneLayerLate(Engine):
    """The dump path takes every aux state one layer later than it says (hidden_states[c + 1])."""

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        _, final, before = super()._gather(rows, states, prenorm, with_prenorm)
        late = torch.stack([rows(states[c + 1]) for c in self.capture], dim=1)
        return late, final, before


class FinalBeforeNorm(Engine):
    """The dump path stores the final layer's pre-norm output as the post-norm final state."""

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        aux, _, before = super()._gather(rows, states, prenorm, True)
        return aux, before, before if with_prenorm else None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    started: list[RunningServer] = []

    def start(model: Path, engine_class: type[Engine] = Engine, **settings: Any) -> RunningServer:
        engine = engine_class(ServeConfig(model=model, dump_dir=tmp_path / f"dumps{len(started)}", **settings))
        front = HttpFront(engine, "127.0.0.1", 0)
        threading.Thread(target=front.serve_forever, name="test-http", daemon=True).start()
        started.append(RunningServer(engine, front))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def test_the_answer_is_the_unbatched_forward_in_sglangs_shape(model_dir, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "float32"), chunked_prefill_size=32)
    ids = list(range(10, 80))  # longer than a chunk: the spot check is one forward all the same
    body = httpx.post(server.url + "/generate", json=SpotCheckRequest("check-1", ids).to_json(), timeout=60).json()
    answer = SpotCheckAnswer.parse(body)
    assert answer is not None and answer.rows == len(ids) and answer.hidden.shape == (len(ids), 3 * 64)
    assert answer.final is not None and answer.final.shape == (len(ids), 64)
    assert body["meta_info"]["prompt_tokens"] == len(ids)
    with torch.no_grad():
        out = server.engine.model(torch.tensor([ids]), output_hidden_states=True)
    expected = torch.cat([out.hidden_states[c][0] for c in server.engine.capture], dim=-1)
    assert torch.allclose(answer.hidden, expected, atol=1e-5)
    assert torch.allclose(answer.final, out.hidden_states[-1][0], atol=1e-5)
    assert not (server.dump_dir / "check-1").exists()  # never dumped


@pytest.mark.parametrize(
    ("fmt", "storage"), [("specforge", "auto"), ("speculators", "auto"), ("speculators", "float8_e4m3fn")]
)
def test_a_run_with_the_spot_check_on_passes(model_dir, serve, tmp_path: Path, fmt: str, storage: str) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "bfloat16"), chunked_prefill_size=32)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    summary = run_extraction(
        server.url, write_dataset(tmp_path / "data.jsonl"), out, metrics,
        format=fmt, storage=storage, concurrency=4, spot_check_every=2,
    )  # fmt: skip
    assert summary.status is RunStatus.COMPLETE, summary.fatal_error
    assert errors(out) == []
    recorded = json.loads((out / "data_config.json").read_text())["spot_checks"]
    assert recorded["every"] == 2 and recorded["checked_rows"] == recorded["matched_rows"] == len(LENGTHS) // 2
    assert recorded["mismatched_rows"] == recorded["failed_requests"] == 0
    fp8_prenorm = storage == "float8_e4m3fn"  # speculators' FP8 final slot is pre-norm: the engine's final is post-norm
    assert recorded["checked_tensors"] == ["aux layer 1", "aux layer 3", "aux layer 4", *([] if fp8_prenorm else ["final"])]
    assert recorded["not_checked"] == (["final state (an FP8 dump whose final slot is pre-norm)"] if fp8_prenorm else [])
    assert 0 <= recorded["worst_matching_error"] < 0.02
    assert spot_checks(metrics, "match") == len(LENGTHS) // 2 and spot_checks(metrics, "mismatch") == 0
    assert any(line.startswith("spot check (1 row in 2") for line in summary.hints)


@pytest.mark.parametrize(
    ("engine_class", "tensor"), [(AuxOneLayerLate, "aux layer 1"), (FinalBeforeNorm, "final")], ids=["aux", "norm"]
)
def test_a_broken_dump_path_is_caught_on_the_first_checked_rows_and_stops_the_run(  # type: ignore[no-untyped-def]
    model_dir, serve, tmp_path: Path, engine_class: type[Engine], tensor: str
) -> None:
    server = serve(model_dir("llama", "bfloat16"), engine_class, chunked_prefill_size=32)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    summary = run_extraction(
        server.url, write_dataset(tmp_path / "data.jsonl"), out, metrics,
        concurrency=1, spot_check_every=1, spot_check_max_mismatches=2,
    )  # fmt: skip
    assert summary.status is RunStatus.STOPPED
    assert summary.fatal_error is not None and "2 spot-checked rows differed" in summary.fatal_error
    assert "docs/runbooks/spot-check-mismatch.md" in summary.fatal_error
    assert summary.written_now == 0  # nothing wrong was written
    recorded = errors(out)
    assert [e["reason"] for e in recorded] == ["spot_check_mismatch"] * 2
    message = recorded[0]["message"]
    assert tensor in message and "positions" in message and "worst" in message, message
    assert spot_checks(metrics, "mismatch") == 2 and spot_checks(metrics, "match") == 0
    config = json.loads((out / "data_config.json").read_text())
    assert config["status"] == "stopped" and config["spot_checks"]["mismatched_rows"] == 2
    assert config["failed_samples"] == 2 and config["error_counts"] == {"spot_check_mismatch": 2}


def test_spot_check_off_sends_no_check(model_dir, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "bfloat16"), AuxOneLayerLate)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    summary = run_extraction(server.url, write_dataset(tmp_path / "data.jsonl", [5, 9]), out, metrics, spot_check_every=0)
    assert summary.status is RunStatus.COMPLETE  # the broken engine goes unnoticed: that is what the check is for
    assert sum(spot_checks(metrics, r) for r in ("match", "mismatch", "error")) == 0
    assert json.loads((out / "data_config.json").read_text())["spot_checks"]["checked_rows"] == 0
