"""The next token of every row of a decode step: greedy, or sampled with temperature, top-k and top-p.

SGLang's semantics (``layers/sampler.py``, torch-native path): the logits are divided by the
temperature, turned into probabilities, sorted; ranks from ``top_k`` on are dropped, and so is every
token whose higher-ranked mass already exceeds ``top_p`` (the token that crosses ``top_p`` stays).
Greedy rows (temperature 0, or top-k 1) take the arg-max of the logits, as transformers'
``generate(do_sample=False)`` does.

Each sampled row draws its one uniform number from its own :class:`torch.Generator` (seeded by the
request's ``sampling_seed``), and picks by inverse CDF within its own row: a seeded request's tokens
depend on its logits and its seed only, never on the rows batched with it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from hsextract.contract.generate import SamplingParams


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own random stream (None for a greedy request): seeded, or from the OS when unseeded."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    return generator


def filter_probs(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' kept probabilities in descending order and their token ids: ``[B, V]`` each.

    ``temperatures``, ``top_ks`` (the vocabulary size for "all") and ``top_ps`` are ``[B]``.
    """
    probs = torch.softmax(logits.float() / temperatures.view(-1, 1), dim=-1)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True, stable=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    ranks = torch.arange(probs_sort.shape[-1], device=probs.device).view(1, -1)
    probs_sort[ranks >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    return probs_sort, probs_idx


def sample_sorted(probs_sort: torch.Tensor, probs_idx: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF pick per row: the first rank whose cumulative kept mass passes ``u * total``."""
    cdf = torch.cumsum(probs_sort, dim=-1)
    target = uniforms.view(-1, 1).to(cdf.dtype) * cdf[:, -1:]
    rank = torch.searchsorted(cdf, target, right=True).clamp_(max=probs_sort.shape[-1] - 1)
    # a rank whose own mass is 0 (dropped) can only be hit through rounding at the top: step back to a kept one
    kept = probs_sort.gather(1, rank) > 0
    rank = torch.where(kept, rank, (probs_sort > 0).sum(dim=-1, keepdim=True) - 1)
    return probs_idx.gather(1, rank).view(-1)


def next_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of ``logits`` ``[B, V]`` (on its device, int64 ``[B]``)."""
    vocab = int(logits.shape[-1])
    tokens = torch.argmax(logits, dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return tokens
    device = logits.device
    index = torch.tensor(sampled, dtype=torch.int64, device=device)
    rows = logits.index_select(0, index)
    temperatures = torch.tensor([params[i].temperature for i in sampled], dtype=torch.float32, device=device)
    top_ks = torch.tensor([params[i].top_k if params[i].top_k > 0 else vocab for i in sampled], device=device)
    top_ps = torch.tensor([params[i].top_p for i in sampled], dtype=torch.float32, device=device)
    probs_sort, probs_idx = filter_probs(rows, temperatures, top_ks, top_ps)
    uniforms = []
    for i in sampled:
        generator = generators[i]
        assert generator is not None, "a sampled request has its generator"
        uniforms.append(torch.rand((), generator=generator, device=device, dtype=torch.float64))
    picked = sample_sorted(probs_sort, probs_idx, torch.stack(uniforms))
    tokens[index] = picked
    return tokens
