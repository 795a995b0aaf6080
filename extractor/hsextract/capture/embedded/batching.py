"""Which waiting prompts form the next batched forward: little padding, nobody starved.

The oldest waiting prompt is always in the next batch, so every prompt is forwarded within as
many steps as there are prompts ahead of it. The rest of the batch is the run of prompts around
it in length order, within a window of the oldest waiting ones, grown one neighbour at a time
(whichever adds less padding) while the padded batch fits the token budget.
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_tokens(lengths: Sequence[int]) -> int:
    """Token slots a right-padded batch of these lengths occupies."""
    return max(lengths, default=0) * len(lengths)


def pick_batch(lengths: Sequence[int], budget: int) -> list[int]:
    """Indices into ``lengths`` (arrival order: index 0 is the oldest) of the next batch, ascending.

    The oldest is always taken, even alone over ``budget``.
    """
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    low = high = order.index(0)
    longest, count = lengths[0], 1
    while True:
        best: tuple[int, int] | None = None  # (added padding, -1 for the shorter side / +1 longer)
        if low > 0 and longest * (count + 1) <= budget:
            best = (longest - lengths[order[low - 1]], -1)
        if high + 1 < len(order):
            grown = lengths[order[high + 1]]
            if grown * (count + 1) <= budget:
                waste = (grown - longest) * count
                if best is None or waste < best[0]:
                    best = (waste, 1)
        if best is None:
            break
        if best[1] < 0:
            low -= 1
        else:
            high += 1
            longest = lengths[order[high]]
        count += 1
    return sorted(order[low : high + 1])
