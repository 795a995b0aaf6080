"""Prompt lookup (n-gram) drafting: the drafter a user gets for free (vLLM's and SGLang's ``ngram``).

At verification point ``p`` the context is ``x_0 .. x_{p+1}``; the longest suffix of it of
``max_ngram`` down to ``min_ngram`` tokens that occurred earlier in the context is looked up, its
most recent earlier occurrence taken, and the ``k`` tokens that followed it proposed. No match: no
proposal (-1, never accepted).
"""

from __future__ import annotations

import torch


def prompt_lookup_drafts(tokens: torch.Tensor, k: int, max_ngram: int = 3, min_ngram: int = 1) -> torch.Tensor:
    """``drafts [k, T]`` in :mod:`hsextract.evaluate.acceptance`'s convention for one sequence."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
    ids = tokens.tolist()
    length = len(ids)
    drafts = [[-1] * length for _ in range(k)]
    # last[n][gram]: the end index (exclusive) of the most recent occurrence of that n-gram seen so far
    last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
    for end in range(1, length + 1):  # the context is ids[:end]; point p = end - 2
        p = end - 2
        if p >= 0:
            for n in range(max_ngram, min_ngram - 1, -1):
                if end < n:
                    continue
                start = last[n].get(tuple(ids[end - n : end]))
                if start is not None:
                    follow = ids[start : min(start + k, end)]  # only tokens the context already holds
                    for j, token in enumerate(follow):
                        drafts[j][p] = token
                    break
        for n in range(min_ngram, max_ngram + 1):  # record the n-grams ending at end, for later points
            if end >= n:
                last[n][tuple(ids[end - n : end])] = end
    return torch.tensor(drafts, dtype=torch.long).reshape(k, length)
