"""The spot check against the embedded server: the engine's own hidden states of every Nth row (an
unbatched forward, answered in ``meta_info.hidden_states`` as SGLang does) against its dump.

No false alarm with every row checked: the tiny models (the MoE DeepSeek-V3 one included) and a deeper,
wider one, in bfloat16 and float32, stored as the model's dtype and as FP8, chunked and batched, at
concurrency 1 and at the default. Each broken dump path of :mod:`hsextract.dev.faulty_engines` (aux
states a layer late, the final state before the norm, every state a token late, another row's states,
FP8 scales doubled) is caught on the first checked row with the CLI's defaults, the row goes to
errors.jsonl naming the tensor and both distances, and the run stops after ``spot_check_max_mismatches``.
The broken engines are the real one with one step of its dump path changed; the spot check's path
(``_forward_alone``) is left as it is.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from hsextract.capture.embedded import Engine
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.front import HttpFront
from hsextract.contract.spot_check import STATES_MEDIA_TYPE, SpotCheckAnswer, SpotCheckRequest
from hsextract.contract.states import RunStatus
from hsextract.dev.faulty_engines import FAULTS, AuxOneLayerLate, FinalBeforeNorm
from hsextract.dev.tiny_model import make_tiny_model
from hsextract.extract.config import ExtractConfig
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.run import Extraction

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


DEFAULT_CONCURRENCY: int = ExtractConfig.model_fields["concurrency"].default


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Deeper and wider than the tiny ones: 24 layers of 256 (bfloat16), aux layers 1, 11, 20."""
    return make_tiny_model(tmp_path_factory.mktemp("deep"), arch="llama", layers=24, hidden=256, vocab_size=1024)


def test_the_answer_is_the_unbatched_forward_in_sglangs_shape(model_dir, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "float32"), chunked_prefill_size=32)
    ids = list(range(10, 80))  # longer than a chunk: the spot check is one forward all the same
    body = httpx.post(server.url + "/generate", json=SpotCheckRequest("check-1", ids).to_json(), timeout=60).json()
    answer = SpotCheckAnswer.parse(body)
    assert answer is not None and answer.rows == len(ids) and answer.hidden.shape == (len(ids), 3 * 64)
    assert answer.final is not None and answer.final.shape == (len(ids), 64)
    assert answer.prenorm is not None and answer.prenorm.shape == (len(ids), 64)
    assert body["meta_info"]["prompt_tokens"] == len(ids)
    prenorm: list[torch.Tensor] = []
    base = server.engine.base
    grab = base.norm.register_forward_hook(lambda module, args, output: prenorm.append(args[0]))
    with torch.no_grad():
        out = server.engine.model(torch.tensor([ids]), output_hidden_states=True)
    grab.remove()
    expected = torch.cat([out.hidden_states[c][0] for c in server.engine.capture], dim=-1)
    assert torch.allclose(answer.hidden, expected, atol=1e-5)
    assert torch.allclose(answer.final, out.hidden_states[-1][0], atol=1e-5)
    assert torch.allclose(answer.prenorm, prenorm[-1][0], atol=1e-5)
    assert not (server.dump_dir / "check-1").exists()  # never dumped


def test_the_binary_answer_holds_the_json_answers_states_in_the_engines_dtype(model_dir, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "bfloat16"))
    body = SpotCheckRequest("check-2", list(range(10, 60))).to_json()
    as_json = httpx.post(server.url + "/generate", json=body, timeout=60)
    binary = httpx.post(server.url + "/generate", json=body, headers={"Accept": STATES_MEDIA_TYPE}, timeout=60)
    assert as_json.headers["content-type"].startswith("application/json")
    assert binary.headers["content-type"] == STATES_MEDIA_TYPE
    assert len(binary.content) * 4 < len(as_json.content)  # bf16 bytes, not decimal float32
    from_json, from_binary = SpotCheckAnswer.parse(as_json.json()), SpotCheckAnswer.parse_states_bytes(binary.content)
    assert from_json is not None and from_binary is not None and from_binary.rid == "check-2"
    for name in ("hidden", "final", "prenorm", "neighbours"):
        assert torch.equal(getattr(from_json, name), getattr(from_binary, name)), name
    assert SpotCheckAnswer.parse_states_bytes(as_json.content) is None  # JSON is not taken for states


def test_the_extractor_asks_for_the_binary_answer(model_dir, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "bfloat16"))
    seen: list[str] = []
    httpx_post = httpx.Client.post

    def post(client: httpx.Client, url: str, **kwargs: Any) -> httpx.Response:
        response = httpx_post(client, url, **kwargs)
        seen.append(response.headers.get("content-type", ""))
        return response

    with pytest.MonkeyPatch.context() as patch:  # watch the real client's real requests, change nothing
        patch.setattr(httpx.Client, "post", post)
        metrics = ExtractMetrics()
        data = write_dataset(tmp_path / "data.jsonl")
        summary = run_extraction(server.url, data, tmp_path / "out", metrics, spot_check_every=1)
    assert summary.status is RunStatus.COMPLETE, summary.fatal_error
    assert seen.count(STATES_MEDIA_TYPE) == spot_checks(metrics, "match") == len(LENGTHS)


def test_the_server_counts_the_time_its_checks_take(model_dir, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two figures per check: its thread's host time launching it (on a busy GPU partly a wait for room in the
    launch queue) and its forward's span on the device (on a stream of its own there; host time on the CPU)."""
    server = serve(model_dir("llama", "bfloat16"))
    data = write_dataset(tmp_path / "data.jsonl")
    summary = run_extraction(server.url, data, tmp_path / "out", ExtractMetrics(), spot_check_every=2)
    assert summary.status is RunStatus.COMPLETE, summary.fatal_error
    served = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    values = {(s.name, s.labels.get("stage")): s.value for family in served for s in family.samples}
    # rows 0, 2, 4, 6, 8 (the first row and every 2nd): what a benchmark divides by the run's time
    for stage in ("spot_check", "spot_check_forward"):
        assert values[("hsextract_server_stage_seconds_count", stage)] == len(LENGTHS) // 2, stage
        assert values[("hsextract_server_stage_seconds_sum", stage)] > 0, stage


class HeldChecks(Engine):
    """Every check held, once started, until the test lets it go."""

    def __init__(self, config: ServeConfig) -> None:
        self.check_started, self.release_checks = threading.Event(), threading.Event()
        super().__init__(config)

    def _forward_alone(self, request: Any) -> Any:
        self.check_started.set()
        assert self.release_checks.wait(60)
        return super()._forward_alone(request)


def test_rows_go_on_while_a_check_is_in_flight(model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Launching a check's batch-1 forward is bound by its Python: 0.24-0.29 s of host time a check on a
    Kimi-shaped MoE on the H200. On the scheduler's thread no batch was launched meanwhile and the device ran
    dry behind the check (the rows' stream busy 0.933 of the run against 0.955 with the check off). A check has
    a thread of its own: the rows' forwards go on while one is in flight."""
    engine = HeldChecks(ServeConfig(model=model_dir("llama", "bfloat16"), dump_dir=tmp_path / "dumps"))
    try:
        prompt = list(range(5, 40))
        check = engine.spot_check("check", prompt)
        assert engine.check_started.wait(60)
        rows = [engine.submit(f"row-{i}", list(range(3, 20 + i))) for i in range(4)]
        for row in rows:
            row.result(timeout=60)  # before: stuck behind the held check on the scheduler's thread
        assert not check.done()
        engine.release_checks.set()
        answer = check.result(timeout=60)
        assert answer.rid == "check" and answer.hidden.shape[0] == len(prompt)
        assert answer.prenorm is not None and answer.prenorm.shape[0] == len(prompt)
    finally:
        engine.release_checks.set()
        engine.shutdown()


MODELS = {  # the tiny ones of the suite, and a deeper, wider one
    "deepseek-moe-bf16": ("deepseek_v3", "bfloat16"),
    "deepseek-moe-fp32": ("deepseek_v3", "float32"),
    "llama-bf16": ("llama", "bfloat16"),
    "deep-llama-bf16": ("deep", "bfloat16"),
}


@pytest.mark.parametrize("concurrency", [1, DEFAULT_CONCURRENCY], ids=["alone", "default"])
@pytest.mark.parametrize(
    ("fmt", "storage"),
    [("specforge", "auto"), ("speculators", "auto"), ("speculators", "float8_e4m3fn")],
    ids=["plain", "stacked", "fp8"],
)
@pytest.mark.parametrize("model", list(MODELS))
def test_every_row_checked_gives_no_false_alarm(  # type: ignore[no-untyped-def]
    model_dir, deep_model: Path, serve, tmp_path: Path, model: str, fmt: str, storage: str, concurrency: int
) -> None:
    arch, dtype = MODELS[model]
    server = serve(deep_model if arch == "deep" else model_dir(arch, dtype), chunked_prefill_size=32)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    lengths = [*LENGTHS, 1, 2, 255, 300, 181, 47]  # one position, two, and past spot_check_max_tokens
    summary = run_extraction(
        server.url, write_dataset(tmp_path / "data.jsonl", lengths), out, metrics,
        format=fmt, storage=storage, concurrency=concurrency, spot_check_every=1,
    )  # fmt: skip
    assert summary.status is RunStatus.COMPLETE, summary.fatal_error
    assert errors(out) == []
    recorded = json.loads((out / "data_config.json").read_text())["spot_checks"]
    assert recorded["checked_rows"] == recorded["matched_rows"] == len(lengths)
    assert recorded["mismatched_rows"] == recorded["failed_requests"] == 0
    # speculators' dumps (stacked, bf16 or FP8) hold the pre-norm final state: checked against the engine's pre-norm state
    final = "final before the norm" if fmt == "speculators" else "final"
    assert len(recorded["checked_tensors"]) == 4 and final in recorded["checked_tensors"], recorded["checked_tensors"]
    for name, tensor in recorded["tensors"].items():
        # every tensor judged on every row, and the noise far below the nearest alternative: the check is sure here
        assert tensor["rows"] == tensor["matched"] == len(lengths), (name, tensor)
        assert tensor["smallest_separation"] > 0.1, (name, tensor)
        assert tensor["worst_matching_error"] <= tensor["smallest_separation"] / 4, (name, tensor)
        assert tensor["nearest_alternative"], (name, tensor)
    assert spot_checks(metrics, "match") == len(lengths) and spot_checks(metrics, "mismatch") == 0
    line = next(line for line in summary.hints if line.startswith("spot check (1 row in 1"))
    assert "0 differed" in line and "vs the nearest alternative" in line


FAULT_TENSORS = {  # the tensors each broken dump path must be caught on (the first checked row has them all)
    "aux_one_layer_late": ["aux layer 1", "aux layer 3", "aux layer 4"],
    "final_before_norm": ["final"],
    "states_one_token_late": ["aux layer 1", "aux layer 3", "aux layer 4", "final"],
    "another_rows_states": ["aux layer 1", "aux layer 3", "aux layer 4", "final"],
    "fp8_scale_doubled": ["aux layer 1", "aux layer 3", "aux layer 4"],
}


@pytest.mark.parametrize("arch", ["deepseek_v3", "llama"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_broken_dump_path_is_caught_on_the_first_checked_row(  # type: ignore[no-untyped-def]
    model_dir, serve, tmp_path: Path, fault: str, arch: str
) -> None:
    server = serve(model_dir(arch, "bfloat16"), FAULTS[fault], chunked_prefill_size=32)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    fp8 = fault == "fp8_scale_doubled"
    summary = run_extraction(  # the CLI's defaults (1 row in 200: the first row only), stopping at the first mismatch
        server.url, write_dataset(tmp_path / "data.jsonl", [40, 90, 17, 128]), out, metrics,
        spot_check_max_mismatches=1, **({"format": "speculators", "storage": "float8_e4m3fn"} if fp8 else {}),
    )  # fmt: skip
    assert summary.status is RunStatus.STOPPED, summary.fatal_error
    assert summary.fatal_error is not None and "1 spot-checked rows differed" in summary.fatal_error
    config = json.loads((out / "data_config.json").read_text())
    assert config["spot_checks"]["checked_rows"] == config["spot_checks"]["mismatched_rows"] == 1
    bad = errors(out)
    assert [e["reason"] for e in bad] == ["spot_check_mismatch"]
    message = bad[0]["message"]
    for tensor in FAULT_TENSORS[fault]:
        assert f"{tensor}: " in message and "DIFFERS" in message, (tensor, message)
    assert "from the engine's state" in message and "the nearest alternative, " in message, message
    assert spot_checks(metrics, "mismatch") == 1 and spot_checks(metrics, "match") == 0


@pytest.mark.parametrize(
    ("engine_class", "tensor"), [(AuxOneLayerLate, "aux layer 1"), (FinalBeforeNorm, "final")], ids=["aux", "norm"]
)
def test_a_broken_dump_path_stops_the_run_after_max_mismatches(  # type: ignore[no-untyped-def]
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
    assert tensor in message and "positions" in message and "the nearest alternative, " in message, message
    assert spot_checks(metrics, "mismatch") == 2 and spot_checks(metrics, "match") == 0
    config = json.loads((out / "data_config.json").read_text())
    assert config["status"] == "stopped" and config["spot_checks"]["mismatched_rows"] == 2
    assert config["spot_checks"]["tensors"][tensor]["differed"] == 2
    assert config["failed_samples"] == 2 and config["error_counts"] == {"spot_check_mismatch": 2}


class SlowChecks(Engine):
    """Every check answered after a while, so that a stop finds some in flight."""

    def _forward_alone(self, request: Any) -> Any:
        time.sleep(0.2)
        return super()._forward_alone(request)


def test_a_stopped_run_does_not_count_its_cut_checks_as_failed(  # type: ignore[no-untyped-def]
    model_dir, serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop (Ctrl-C, SIGTERM, a fatal error) shuts every connection: the checks in flight then were counted as
    failed requests and each logged (43 of 58 on the CPU at --spot-check-every 1). They are the stop's: not counted,
    and their rows are left for the next run."""
    server = serve(model_dir("llama", "bfloat16"), SlowChecks, chunked_prefill_size=32)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    config = ExtractConfig(
        server=server.url, dataset=write_dataset(tmp_path / "data.jsonl", [40 + i for i in range(64)]), output=out,
        spot_check_every=1, health_timeout_s=30,
    )  # fmt: skip
    extraction = Extraction(config, metrics=metrics)

    def stop_once_checks_are_queued() -> None:
        while spot_checks(metrics, "match") < 3:
            time.sleep(0.01)
        extraction.request_stop("the test's Ctrl-C")

    threading.Thread(target=stop_once_checks_are_queued, daemon=True).start()
    summary = extraction.run()
    assert summary.status is RunStatus.INTERRUPTED
    recorded = json.loads((out / "data_config.json").read_text())
    assert recorded["spot_checks"]["failed_requests"] == 0 and spot_checks(metrics, "error") == 0
    assert "spot check request failed" not in caplog.text
    assert recorded["total_samples"] == recorded["spot_checks"]["matched_rows"]  # no row written unchecked


def test_spot_check_off_sends_no_check(model_dir, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_dir("llama", "bfloat16"), AuxOneLayerLate)
    metrics = ExtractMetrics()
    out = tmp_path / "out"
    summary = run_extraction(server.url, write_dataset(tmp_path / "data.jsonl", [5, 9]), out, metrics, spot_check_every=0)
    assert summary.status is RunStatus.COMPLETE  # the broken engine goes unnoticed: that is what the check is for
    assert sum(spot_checks(metrics, r) for r in ("match", "mismatch", "error")) == 0
    assert json.loads((out / "data_config.json").read_text())["spot_checks"]["checked_rows"] == 0
