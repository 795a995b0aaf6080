"""Batch choice of the embedded engine: the oldest prompt always goes, its neighbours in length
fill the budget, and nobody waits for more steps than there were prompts ahead of it."""

from __future__ import annotations

import random

from hsextract.capture.embedded.batching import padded_tokens, pick_batch


def test_the_oldest_goes_even_alone_over_the_budget() -> None:
    assert pick_batch([5000, 10, 10, 10], budget=4096) == [0]
    assert pick_batch([], budget=4096) == []


def test_neighbours_in_length_fill_the_budget_around_the_oldest() -> None:
    lengths = [100, 900, 110, 95, 1000, 105, 2000]
    chosen = pick_batch(lengths, budget=440)
    assert 0 in chosen and sorted(lengths[i] for i in chosen) == [95, 100, 105, 110]
    assert padded_tokens([lengths[i] for i in chosen]) <= 440


def test_a_long_oldest_takes_the_long_ones() -> None:
    lengths = [1000, 100, 110, 900, 120, 950]
    chosen = pick_batch(lengths, budget=3000)
    assert sorted(lengths[i] for i in chosen) == [900, 950, 1000]


def test_padding_is_far_below_arrival_order_batches() -> None:
    rng = random.Random(3)
    lengths = [max(16, int(rng.lognormvariate(6.6, 0.6))) for _ in range(400)]
    waiting, sorted_padded, real = list(lengths), 0, sum(lengths)
    while waiting:
        chosen = pick_batch(waiting, budget=16384)
        sorted_padded += padded_tokens([waiting[i] for i in chosen])
        waiting = [n for i, n in enumerate(waiting) if i not in set(chosen)]
    arrival_padded, batch = 0, list[int]()
    for n in lengths:  # the old engine: arrival order, cut where the padded batch would overflow
        if batch and padded_tokens([*batch, n]) > 16384:
            arrival_padded += padded_tokens(batch)
            batch = []
        batch.append(n)
    arrival_padded += padded_tokens(batch)
    assert (1 - real / sorted_padded) * 3 < 1 - real / arrival_padded, (real / sorted_padded, real / arrival_padded)


def test_nobody_waits_longer_than_the_queue_ahead_of_it() -> None:
    rng = random.Random(11)
    queue: list[tuple[int, int]] = []  # (request number, length), oldest first
    arrived: dict[int, tuple[int, int]] = {}  # number -> (step, requests ahead of it then)
    served: dict[int, int] = {}
    number = 0
    for step in range(600):
        for _ in range(rng.randint(0, 6)):
            arrived[number] = (step, len(queue))
            queue.append((number, rng.choice([20, 30, 2000, 3000, 4000])))
            number += 1
        if not queue:
            continue
        chosen = set(pick_batch([n for _, n in queue], budget=8192))
        for index in chosen:
            served[queue[index][0]] = step
        queue = [item for index, item in enumerate(queue) if index not in chosen]
    assert len(served) > 1000
    # every step takes the oldest, so k requests ahead are gone within k steps
    late = {n: (served[n] - arrived[n][0], arrived[n][1]) for n in served if served[n] - arrived[n][0] > arrived[n][1]}
    assert not late
    # and the length-sorted choice really does pass over some requests that arrived earlier
    assert any(served[n] > served[m] for n in served for m in (n + 1, n + 2) if m in served)
