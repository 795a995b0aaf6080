"""What the real SGLang server dumps, against transformers and against SGLang itself (llama, qwen2).

Each family's server starts once (float32, chunked prefill of 64 tokens) and serves every test here:
both output formats equal a float32 transformers forward (batch 1, full sequence) at the declared
layers and are clearly farther from the neighbouring ones; the hook's dump equals SGLang's own
``return_hidden_states`` answer for the same prompt; and the default aux layers recorded in the output
are the ones SGLang's own arithmetic captures for the drafter value the output names.
DeepSeek-V3 is not served here: SGLang's CPU path does not run its MLA attention (docs/sglang.md).
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from safetensors.torch import load_file

from hsextract.contract.sglang_capture import SGLANG_MODEL_CLASSES, ModelFamily

from .helpers import (
    CHUNK,
    DEFAULT_AUX,
    LAYERS,
    Reference,
    data_config,
    errors,
    extract,
    read_specforge,
    read_speculators,
    relative_error,
    write_dataset,
)

#: float32 SGLang (torch_native attention, chunked, batched) vs float32 transformers (batch 1): only
#: the summation order differs. Measured worst, relative to the largest value and beyond the storage
#: dtype's rounding: about 1e-6 (speculators, float32) and 2e-7 (specforge, bfloat16).
TOLERANCE = 1e-4
#: a neighbouring layer's state must be at least this far (relative): an off-by-one is never close
NEIGHBOUR_MIN = 100 * TOLERANCE
LENGTHS = [3, 17, 40, 64, 65, 90, 128, 150, 191, 210, 233, 257, 270, 288, 300]  # most above CHUNK


@pytest.fixture(scope="module")
def server(live, family):  # type: ignore[no-untyped-def]
    return live(family)


@pytest.fixture(scope="module")
def outputs(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    """Both formats of the same 15 rows, extracted at concurrency 4."""
    work = tmp_path_factory.mktemp(f"values-{server.family}")
    dataset = write_dataset(work / "data.jsonl", LENGTHS, seed=11)
    made = {}
    for fmt in ("specforge", "speculators"):
        result = extract(server, dataset, work / fmt, "--format", fmt, "--concurrency", "4")
        assert result.returncode == 0, result.stdout + result.stderr
        made[fmt] = work / fmt
    return made


@pytest.fixture(scope="module")
def reference(server) -> Reference:  # type: ignore[no-untyped-def]
    return Reference(server.model)


def _check_own_index(name: str, got: torch.Tensor, states: list[torch.Tensor], index: int) -> float:
    """The error against ``hidden_states[index]``; fails unless small and both neighbours are far."""
    own = relative_error(got, states[index])
    assert own < TOLERANCE, f"{name}: differs from hidden_states[{index}] by {own:.2e} (relative)"
    for neighbour in (index - 1, index + 1):
        if 0 <= neighbour < len(states) - 1:  # the last entry is post-norm, checked on its own
            far = relative_error(got, states[neighbour])
            assert far > NEIGHBOUR_MIN, (
                f"{name}: as close to hidden_states[{neighbour}] ({far:.2e}) as to its own index {index} ({own:.2e})"
            )
    return own


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_both_formats_match_transformers_at_the_declared_layers(
    server,
    outputs: dict[str, Path],
    reference: Reference,
    fmt: str,  # type: ignore[no-untyped-def]
) -> None:
    out = outputs[fmt]
    config = data_config(out)
    assert config["status"] == "complete" and config["total_samples"] == len(LENGTHS), config
    assert errors(out) == []
    aux_ids = config["aux_layer_ids"]
    assert aux_ids == DEFAULT_AUX and config["hf_hidden_states_indices"] == [2, 4, 5, LAYERS]
    read = read_specforge if fmt == "specforge" else read_speculators
    worst = 0.0
    for row, length in enumerate(LENGTHS):
        stored = read(out, row)
        assert stored.input_ids.shape == (length,) and stored.aux.shape == (length, 3, stored.final.shape[-1])
        states, prenorm = reference.states(stored.input_ids)
        for k, layer_id in enumerate(aux_ids):
            worst = max(worst, _check_own_index(f"{fmt} row {row} aux layer {layer_id}", stored.aux[:, k], states, layer_id + 1))
        if fmt == "specforge":  # the final state after the norm, in bfloat16
            assert stored.final.dtype == torch.bfloat16
            final = relative_error(stored.final, states[-1])
        else:  # the final layer's pre-norm output, float32; the trainer's norm gives the post-norm state
            assert stored.final.dtype == torch.float32
            final = relative_error(stored.final, prenorm)
            with torch.no_grad():
                normed = reference.norm(stored.final)
            final = max(final, relative_error(normed, states[-1]))
        assert final < TOLERANCE, f"{fmt} row {row}: final state off by {final:.2e}"
        worst = max(worst, final)
    print(f"\n{server.family} {fmt}: worst relative error against float32 transformers {worst:.2e}")
    assert max(LENGTHS) > CHUNK and sum(n > CHUNK for n in LENGTHS) > len(LENGTHS) // 2  # chunked prefill ran


@pytest.mark.parametrize("length", [50, 150])  # one extend pass; three (64 + 64 + 22)
def test_hook_dump_equals_sglangs_own_return_hidden_states(server, length: int) -> None:  # type: ignore[no-untyped-def]
    """Two paths inside one engine: the hook's dump and SGLang's JSON copy of the aux states.

    SGLang 0.5.23 returns only the last extend pass's rows of a chunked prompt (seen here: 22 of 150
    with chunks of 64); the hook assembles every pass. The rows SGLang returns must equal the dump's."""
    ids = torch.randint(0, 1000, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    rid = f"hsx-{999_000_000 + length:09d}-n{length}"  # a rid the hook dumps
    body = {
        "input_ids": ids, "rid": rid, "return_hidden_states": True,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    }  # fmt: skip
    answer = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    answer.raise_for_status()
    returned = torch.tensor(answer.json()["meta_info"]["hidden_states"][0], dtype=torch.float32)
    dump = server.dump_dir / rid
    deadline = time.monotonic() + 60
    while not (dump / "done").exists():
        assert time.monotonic() < deadline, f"no dump of {rid} within 60 s: {list(server.dump_dir.iterdir())}"
        time.sleep(0.1)
    try:
        tensors = load_file(str(dump / "hidden.safetensors"))
        meta = json.loads((dump / "meta.json").read_text())
    finally:
        for path in sorted(dump.iterdir()):
            path.unlink()
        dump.rmdir()
    aux = tensors["aux_hidden_states"]
    assert tensors["input_ids"].tolist() == ids and aux.dtype == torch.float32 and aux.shape[0] == length
    assert meta["layer_ids"] == DEFAULT_AUX and meta["engine"] == "sglang"
    # SGLang returns the aux states concatenated in layer order, [rows, K*H]: all rows, or the last pass's
    rows = returned.shape[0]
    assert rows in (length, (length - 1) % CHUNK + 1) and returned.shape[1] == aux.shape[1] * aux.shape[2]
    difference = (aux[length - rows :].reshape(rows, -1) - returned).abs().max().item()
    assert difference == 0.0, f"the dump and SGLang's return_hidden_states differ by {difference}"


def test_default_aux_layers_are_what_sglang_captures_for_the_drafter_value(server, outputs: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    """The drafter value the output names, served back through SGLang's own arithmetic, captures the
    layers whose states the output holds (checked against transformers above); and with no ids at all
    SGLang captures the same ones."""
    config = data_config(outputs["specforge"])
    serving = config["serving"]
    draft_ids = serving["draft_config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    module, name = SGLANG_MODEL_CLASSES[ModelFamily(server.family)]
    method = getattr(importlib.import_module(module), name).set_eagle3_layers_to_capture

    def sglang_capture(ids: list[int] | None) -> list[int]:
        stand_in = SimpleNamespace(
            pp_group=SimpleNamespace(is_last_rank=True),
            config=SimpleNamespace(num_hidden_layers=LAYERS),
            model=SimpleNamespace(layers_to_capture=[]),
            capture_aux_hidden_states=False,
        )
        method(stand_in, ids)
        return list(stand_in.model.layers_to_capture)

    held = config["hf_hidden_states_indices"][:-1]  # what the output holds: hidden_states[2, 4, 5]
    assert sglang_capture(draft_ids) == held == config["sglang_layers_to_capture"] == serving["layers_to_capture"]
    assert sglang_capture(None) == held, "SGLang's default capture differs from the output's default layers"
    # the live server was started with that same value, and reports it
    assert server.server_info()["return_aux_hidden_state_layer_ids"] == draft_ids
