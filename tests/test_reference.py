"""The layer-convention check: every dumped state equals the transformers forward at its own index.

An off-by-one in the layer numbering is silent in every other test; here it fails loudly, because
each captured tensor must match hidden_states[layer_id + 1] of a plain full-sequence, batch-1
forward and be clearly farther from the neighbouring indices.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from hsextract.dev.sample_data import make_sample_data
from hsextract.output.formats import open_format

from .helpers import run_extraction

TOLERANCE = 2e-4  # float32 reference; batching and chunking only change the summation order
#: how far storing a float32 value in a narrower dtype may move it, relative to the value (unit roundoff)
UNIT_ROUNDOFF = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def deviation(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference from the float32 reference beyond what storing ``got`` in its dtype explains.

    SpecForge's layout stores bfloat16 (its trainer's dtype): each value may then be off by one rounding,
    at most ``|ref| * 2**-8``; anything past that is a real difference."""
    rounding = ref.abs() * UNIT_ROUNDOFF[got.dtype]
    return float(((got.float() - ref).abs() - rounding).clamp(min=0).max().item())


def reference_states(model_path: Path, ids: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path)).eval()
    captured: dict[str, torch.Tensor] = {}
    model.base_model.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("prenorm", a[0]))
    with torch.no_grad():
        out = model(ids.unsqueeze(0), output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states), captured["prenorm"][0]


def assert_matches_own_index(name: str, got: torch.Tensor, states: tuple[torch.Tensor, ...], index: int) -> None:
    own = deviation(got, states[index])
    assert own < TOLERANCE, f"{name} differs from hidden_states[{index}] by {own} beyond {got.dtype} rounding"
    for neighbour in (index - 1, index + 1):
        if 0 <= neighbour < len(states) - 1:  # the last entry is post-norm, compared separately
            far = deviation(got, states[neighbour])
            assert far > 100 * TOLERANCE, f"{name} is as close to hidden_states[{neighbour}] ({far}) as to its own ({own})"


@pytest.mark.parametrize("arch", ["deepseek_v3", "llama"])
@pytest.mark.parametrize("chunked_prefill_size", [-1, 96])
def test_dumped_states_match_transformers(model_dir, start_server, tmp_path: Path, arch: str, chunked_prefill_size: int) -> None:
    model = model_dir(arch)
    server = start_server(model, chunked_prefill_size=chunked_prefill_size, max_batch_tokens=2048)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=6, vocab_size=1024, seed=3, max_len=400)
    summary = run_extraction(server.url, dataset, tmp_path / "out", concurrency=4, max_seq_len=300)
    assert summary.status == "complete" and summary.total_samples == 6
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    aux_ids = config["aux_layer_ids"]
    # the default: outputs [1, N//2-1, N-4] = hidden_states[2, N//2, N-3], SGLang's and the trainers' default
    assert aux_ids == [1, 3, 4] and config["layer_ids"] == [1, 3, 4, 7]
    assert config["sglang_layers_to_capture"] == config["hf_hidden_states_indices"][:3] == [2, 4, 5]
    fmt = open_format("specforge", tmp_path / "out")
    passes = []
    for row in range(6):
        stored = fmt.read_sample(row)
        states, _ = reference_states(model, stored.input_ids)
        for k, layer_id in enumerate(aux_ids):
            assert_matches_own_index(f"row {row} aux layer {layer_id}", stored.aux_hidden_states[:, k], states, layer_id + 1)
        assert stored.aux_hidden_states.dtype == stored.final_hidden_state.dtype == torch.bfloat16  # SpecForge's dtype
        final_error = deviation(stored.final_hidden_state, states[-1])
        assert final_error < TOLERANCE, f"row {row}: final state differs from the post-norm state by {final_error}"
        passes.append(stored.input_ids.shape[0])
    if chunked_prefill_size > 0:
        assert max(passes) > chunked_prefill_size, "no prompt was long enough to be chunked"


def test_speculators_last_slot_is_prenorm_and_norms_to_final(model_dir, start_server, tmp_path: Path) -> None:
    model = model_dir("deepseek_v3")
    server = start_server(model, chunked_prefill_size=64)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=3, vocab_size=1024, seed=5, max_len=200)
    summary = run_extraction(server.url, dataset, tmp_path / "out", format="speculators", concurrency=3)
    assert summary.status == "complete"
    fmt = open_format("speculators", tmp_path / "out")
    norm = transformers.AutoModelForCausalLM.from_pretrained(str(model)).base_model.norm
    assert isinstance(norm, torch.nn.Module)
    for row in range(3):
        stored = fmt.read_sample(row)
        states, prenorm = reference_states(model, stored.input_ids)
        assert stored.aux_hidden_states.dtype == torch.float32  # stored as computed: its loader casts itself
        assert (stored.final_hidden_state - prenorm).abs().max().item() < TOLERANCE
        # The conversion the speculators trainer applies (verifier norm) gives the post-norm state.
        with torch.no_grad():
            assert (norm(stored.final_hidden_state) - states[-1]).abs().max().item() < TOLERANCE
        for k, layer_id in enumerate([1, 3, 4]):
            assert_matches_own_index(f"row {row} aux {layer_id}", stored.aux_hidden_states[:, k], states, layer_id + 1)


def test_bfloat16_model_dumps_bfloat16(model_dir, start_server, tmp_path: Path) -> None:
    model = model_dir("deepseek_v3", "bfloat16")
    server = start_server(model)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=2, vocab_size=1024, seed=1, max_len=100)
    run_extraction(server.url, dataset, tmp_path / "out")
    stored = open_format("specforge", tmp_path / "out").read_sample(0)
    assert stored.aux_hidden_states.dtype == torch.bfloat16
    states, _ = reference_states(model, stored.input_ids)
    error = (stored.aux_hidden_states[:, 0].float() - states[2].float()).abs().max().item()  # layer 1's output
    assert error < 0.1 * states[2].float().abs().max().item()


def test_an_explicit_choice_is_one_setting_away(model_dir, start_server, tmp_path: Path) -> None:
    # the reference Kimi run's kind of choice: one layer later than the default
    model = model_dir("llama")
    server = start_server(model, layer_ids=[2, 4, 5])
    dataset = make_sample_data(tmp_path / "data.jsonl", num=2, vocab_size=1024, seed=4, max_len=120)
    run_extraction(server.url, dataset, tmp_path / "out", layer_ids=[2, 4, 5])
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["aux_layer_ids"] == [2, 4, 5] and config["sglang_layers_to_capture"] == [3, 5, 6]
    stored = open_format("specforge", tmp_path / "out").read_sample(1)
    states, _ = reference_states(model, stored.input_ids)
    for k, layer_id in enumerate([2, 4, 5]):
        assert_matches_own_index(f"aux {layer_id}", stored.aux_hidden_states[:, k], states, layer_id + 1)


def test_batches_padded_to_a_graph_bucket_dump_the_same_states(model_dir, start_server, tmp_path: Path, monkeypatch) -> None:
    """On a GPU a small model's batches run padded to a CUDA graph's bucket: extra pad columns to a multiple of
    LENGTH_STEP and whole pad rows to a power of two (capture/embedded/forward_graphs.py). Here, on the CPU, the
    engine pads its batches the same way and runs them eagerly, as it does on a GPU once MAX_GRAPHS are captured:
    every real token's states must still be the unbatched forward's, at their own layer."""
    from hsextract.capture.embedded import forward_graphs

    monkeypatch.setattr(forward_graphs, "MAX_GRAPHS", 0)
    model = model_dir("llama")
    server = start_server(model, max_batch_tokens=4096)
    engine = server.engine
    engine.graphs = forward_graphs.ForwardGraphs(engine._eager_forward, [*engine.capture, -1], engine.device)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=6, vocab_size=1024, seed=5, max_len=200)
    summary = run_extraction(server.url, dataset, tmp_path / "out", concurrency=6, max_seq_len=300)
    assert summary.status == "complete" and summary.total_samples == 6
    tokens, padded = engine.clock.tokens._value.get(), engine.clock.padded_tokens._value.get()
    assert padded >= tokens + forward_graphs.LENGTH_STEP  # the batches really ran padded to their buckets
    fmt = open_format("specforge", tmp_path / "out")
    aux_ids = json.loads((tmp_path / "out" / "data_config.json").read_text())["aux_layer_ids"]
    for row in range(6):
        stored = fmt.read_sample(row)
        states, _ = reference_states(model, stored.input_ids)
        for k, layer_id in enumerate(aux_ids):
            assert_matches_own_index(f"row {row} aux layer {layer_id}", stored.aux_hidden_states[:, k], states, layer_id + 1)
        assert deviation(stored.final_hidden_state, states[-1]) < TOLERANCE
