"""Chain acceptance of a drafter's guesses against the target's greedy tokens.

The convention every drafter here is measured in (speculators' ``shift_batch``, EAGLE-3 inference):
for a sequence ``x_0 .. x_{T-1}``, at a verification point ``p`` the target has processed
``x_0 .. x_p`` and emitted ``x_{p+1}``; the drafter then guesses ``drafts[j, p]`` for ``x_{p+2+j}``,
``j = 0 .. k-1``, each guess after the first made on its own earlier guesses. Greedy verification
accepts the longest prefix of guesses equal to the target's own greedy tokens; the target adds one
token of its own either way, so a cycle yields ``1 + accepted`` tokens.

Guesses past the first are computed with the true tokens as the drafter's input (teacher forcing):
that equals drafting on its own guesses exactly where it matters, since a guess counts only while
every earlier one was right. A guess is right when it equals the target's greedy token there *and*
the text itself continues with that token (held-out text the target regenerated greedily, re-tokenized,
follows the greedy path almost everywhere; where it does not the chain stops, the same for every
drafter measured on that text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AcceptanceCounts:
    """Verification points and, per draft position, how many had every guess up to it accepted."""

    k: int
    cycles: int = 0
    accepted_through: list[int] = field(default_factory=list)  # [j]: cycles whose guesses 0..j were all right

    def __post_init__(self) -> None:
        if not self.accepted_through:
            self.accepted_through = [0] * self.k

    def add(self, other: AcceptanceCounts) -> None:
        if other.k != self.k:
            raise ValueError(f"cannot add counts for {other.k} draft positions to counts for {self.k}")
        self.cycles += other.cycles
        self.accepted_through = [a + b for a, b in zip(self.accepted_through, other.accepted_through, strict=True)]

    def summary(self) -> dict[str, Any]:
        """``agreement[j]``: guess j right given guesses before it right (the per-position acceptance
        rate); ``reached[j]``: the share of cycles accepting at least j+1 guesses; the expected
        acceptance length ``1 + sum(reached)`` (tokens per target forward, greedy, chain drafting)."""
        cycles = max(self.cycles, 1)
        reached = [n / cycles for n in self.accepted_through]
        before = [self.cycles, *self.accepted_through[:-1]]
        agreement = [n / b if b else 0.0 for n, b in zip(self.accepted_through, before, strict=True)]
        return {
            "k": self.k,
            "cycles": self.cycles,
            "agreement": [round(a, 4) for a in agreement],
            "reached": [round(r, 4) for r in reached],
            "expected_acceptance_length": round(1.0 + sum(reached), 4),
        }


def chain_acceptance(
    drafts: torch.Tensor, tokens: torch.Tensor, greedy: torch.Tensor, response: torch.Tensor
) -> AcceptanceCounts:
    """Count the accepted guesses of one sequence.

    ``drafts [k, T]`` (``drafts[j, p]`` guesses ``x_{p+2+j}``; any value past the sequence is ignored),
    ``tokens [T]`` the text, ``greedy [T]`` the target's greedy next token at each position
    (``greedy[p]`` is its choice for ``x_{p+1}``), ``response [T]`` true where the token is one the
    target wrote (the loss mask). Verification points are the positions ``p`` whose emitted token
    ``x_{p+1}`` is a response token; a guess counts only inside the response."""
    k, length = drafts.shape
    if tokens.shape != (length,) or greedy.shape != (length,) or response.shape != (length,):
        raise ValueError(f"drafts {tuple(drafts.shape)} and tokens/greedy/response of length {length} disagree")
    counts = AcceptanceCounts(k=k)
    if length < 3:
        return counts
    response = response.bool()
    points = torch.nonzero(response[1:], as_tuple=False).flatten()  # p with x_{p+1} in the response
    counts.cycles = int(points.numel())
    if counts.cycles == 0:
        return counts
    # right[j, p]: guess j at point p equals the target's greedy x_{p+2+j} and the text goes that way
    right = torch.zeros((k, points.numel()), dtype=torch.bool)
    for j in range(k):
        target_pos = points + 2 + j
        inside = target_pos < length
        pos = target_pos.clamp(max=length - 1)
        ok = (drafts[j, points] == greedy[pos - 1]) & (greedy[pos - 1] == tokens[pos]) & response[pos] & inside
        right[j] = ok
    chained = torch.cumprod(right.to(torch.int64), dim=0)
    counts.accepted_through = [int(n) for n in chained.sum(dim=1)]
    return counts
