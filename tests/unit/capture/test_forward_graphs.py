"""When the embedded engine runs its batched forwards as CUDA graphs, and into which padded shape
(capture/embedded/forward_graphs.py). The replays themselves need a GPU: ``make bench-gpu-e2e`` runs them, its
reference checks and the run's spot checks compare their states with unbatched forwards."""

from __future__ import annotations

import pytest
import torch
import transformers

from hsextract.capture.embedded import forward_graphs
from hsextract.capture.embedded.forward_graphs import (
    LENGTH_STEP,
    ForwardGraphs,
    bucket,
    non_embedding_parameters,
    use_graphs,
)


@pytest.mark.parametrize(
    ("rows", "length", "expected"),
    [
        (1, 1, (1, LENGTH_STEP)),
        (1, LENGTH_STEP, (1, LENGTH_STEP)),
        (3, LENGTH_STEP + 1, (4, 2 * LENGTH_STEP)),
        (4, 450, (4, 512)),
        (5, 400, (8, 448)),
        (17, 100, (32, 128)),
    ],
)
def test_a_batch_runs_in_the_next_power_of_two_of_rows_and_multiple_of_the_step_of_tokens(
    rows: int, length: int, expected: tuple[int, int]
) -> None:
    assert bucket(rows, length, max_tokens=1 << 20) == expected


def test_a_bucket_over_the_token_budget_runs_unpadded() -> None:
    assert bucket(5, 400, max_tokens=8 * 448) == (8, 448)
    assert bucket(5, 400, max_tokens=8 * 448 - 1) is None  # the engine then launches it eagerly, as it came


def test_auto_captures_small_models_on_a_gpu_only() -> None:
    small, large = forward_graphs.AUTO_MAX_PARAMETERS, forward_graphs.AUTO_MAX_PARAMETERS + 1
    assert use_graphs("auto", cuda=True, parameters=small)
    assert not use_graphs("auto", cuda=True, parameters=large)  # the launch hides behind the computation
    assert use_graphs("on", cuda=True, parameters=large)
    assert not use_graphs("off", cuda=True, parameters=small)
    assert not use_graphs("on", cuda=False, parameters=small)  # no graphs without CUDA


def test_the_parameters_counted_leave_out_the_embeddings() -> None:
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000
    )
    base = transformers.LlamaForCausalLM(config).base_model
    total = sum(p.numel() for p in base.parameters())
    assert non_embedding_parameters(base) == total - 1000 * 32


def test_a_capture_that_fails_turns_graphs_off_and_the_batch_runs_eagerly() -> None:
    """Here no GPU: capturing fails, as it would on one for an operator that cannot be captured."""
    calls: list[torch.Tensor] = []

    def forward(ids: torch.Tensor) -> tuple[list[torch.Tensor], None]:
        calls.append(ids)
        return [ids.float()], None

    graphs = ForwardGraphs(forward, [-1], torch.device("cpu"))
    assert graphs.run(torch.zeros((2, LENGTH_STEP), dtype=torch.int64)) is None
    assert not graphs.enabled and graphs.captured == 0
    assert graphs.run(torch.zeros((2, LENGTH_STEP), dtype=torch.int64)) is None  # off: no second try
