"""The decode scheduler's sampling functions (capture/embedded/sampling.py) and the generation wire types."""

from __future__ import annotations

import pytest
import torch

from hsextract.capture.embedded.sampling import filter_probs, make_generator, next_tokens, sample_sorted
from hsextract.contract.generate import FinishReason, GenerationAnswer, GenerationRequest, SamplingParams, wants_decoding
from hsextract.errors import BadRequestError

CPU = torch.device("cpu")


def _logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax_and_top_k_1_is_greedy() -> None:
    logits = _logits()
    greedy = SamplingParams(temperature=0.0)
    top1 = SamplingParams.parse({"max_new_tokens": 4, "top_k": 1, "temperature": 0.8}, 50)
    assert greedy.greedy and top1.greedy
    assert next_tokens(logits, [greedy] * 4, [None] * 4).tolist() == logits.argmax(-1).tolist()
    sampled = SamplingParams(temperature=0.7, top_k=1, seed=3)
    # top-k 1 through the sampled path (filter + inverse CDF) also picks the arg-max
    probs, index = filter_probs(logits, torch.full((4,), 0.7), torch.ones(4, dtype=torch.int64), torch.ones(4))
    assert sample_sorted(probs, index, torch.rand(4, dtype=torch.float64)).tolist() == logits.argmax(-1).tolist()
    assert sampled.greedy


def test_top_k_and_top_p_keep_only_their_tokens() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs, index = filter_probs(logits, torch.ones(1), torch.tensor([4]), torch.tensor([0.7]))
    # 0.5 alone is below 0.7, so the token crossing it (0.3) stays: SGLang's rule
    assert index[0, :2].tolist() == [0, 1] and probs[0, 2:].tolist() == [0.0, 0.0]
    probs, _ = filter_probs(logits, torch.ones(1), torch.tensor([3]), torch.ones(1))
    assert probs[0, 3] == 0 and probs[0, 2] > 0
    draws = {
        int(sample_sorted(*filter_probs(logits, torch.ones(1), torch.tensor([4]), torch.tensor([0.7])), torch.tensor([u])))
        for u in torch.linspace(0, 0.999, 50).tolist()
    }
    assert draws == {0, 1}


def test_a_seeded_row_is_reproducible_whatever_is_batched_with_it() -> None:
    logits = _logits(rows=6)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)

    def run(rows: list[int], steps: int = 20) -> list[int]:
        generators = [make_generator(params, CPU) for _ in rows]
        out = []
        for _ in range(steps):
            out.append(int(next_tokens(logits[rows], [params] * len(rows), generators)[0]))
        return out

    alone = run([0])
    assert run([0, 3, 5]) == alone and run([0, 1]) == alone
    assert len(set(alone)) > 1  # it does sample
    other = SamplingParams(temperature=1.0, top_p=0.9, seed=99)
    generator = make_generator(other, CPU)
    assert [int(next_tokens(logits[[0]], [other], [generator])[0]) for _ in range(20)] != alone


def test_sampling_params_parse_like_sglang() -> None:
    params = SamplingParams.parse({"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [5, 3, 5]}, 10)
    assert params.greedy and params.top_k == 1 and params.stop_token_ids == (3, 5)
    assert SamplingParams.parse({"max_new_tokens": 8, "sampling_seed": 7}, 10).seed == 7
    assert SamplingParams(max_new_tokens=4, seed=7, top_p=0.5).to_json()["sampling_seed"] == 7
    for bad in ({"top_p": 0}, {"top_k": 0}, {"temperature": -1}, {"stop_token_ids": [10]}, {"seed": 3}, {"min_p": 0.2}):
        with pytest.raises(BadRequestError):
            SamplingParams.parse({"max_new_tokens": 4, **bad}, 10)
    assert SamplingParams.parse({"max_new_tokens": 4, "min_p": 0.0, "n": 1}, 10).max_new_tokens == 4


def test_generation_requests_and_answers_round_trip() -> None:
    request = GenerationRequest("r1", [1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0, top_k=1))
    assert wants_decoding(request.to_json()) and not wants_decoding({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}})
    (parsed,), batched = GenerationRequest.parse_batch(request.to_json(), 10)
    assert parsed == request and not batched
    many, batched = GenerationRequest.parse_batch(
        {"input_ids": [[1], [2, 3]], "rid": "b", "sampling_params": {"max_new_tokens": 2}}, 10
    )
    assert batched and [r.rid for r in many] == ["b_0", "b_1"]
    body = GenerationRequest.batch_json(many)
    assert [r.rid for r in GenerationRequest.parse_batch(body, 10)[0]] == ["b_0", "b_1"]
    answer = GenerationAnswer("r1", [4, 2], FinishReason("stop", matched=2), 3, 0.5)
    assert answer.to_json()["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert GenerationAnswer.parse_list([answer.to_json()]) == [answer] and not answer.truncated
    assert GenerationAnswer.parse({"output_ids": [1]}) is None
