"""``token_freq.count_supervised`` against the counting it stands for: a ``Counter`` updated with each row's sorted
unique supervised ids (speculators 0.9.0's ``save_token_frequency_distribution``; tests/trainers runs that code on a
real output). The same dict, key order included, whether the pairs are merged once or many times."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hsextract.output.formats import token_freq


def _counter_per_row(rows: list[tuple[list[int], list[int]]]) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for input_ids, loss_mask in rows:
        if not input_ids:
            continue
        masked = torch.tensor(input_ids)[torch.tensor(loss_mask).to(torch.bool)]
        unique, per_id = torch.unique(masked, sorted=True, return_counts=True)
        counts.update(dict(zip(unique.tolist(), per_id.tolist(), strict=True)))
    return dict(counts)


def _rows(seed: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    rows: list[tuple[list[int], list[int]]] = [([], [])]  # an empty row counts nothing
    for _ in range(60):
        length = rng.randrange(1, 90)
        ids = [rng.randrange(300) for _ in range(length)]
        rows.append((ids, [rng.random() < 0.7 for _ in range(length)]))
    rows.append(([5, 6], [0, 0]))  # no supervised token
    return rows


@pytest.mark.parametrize("merge_every", [1, 37, token_freq.MERGE_EVERY])
def test_the_count_is_the_per_row_counter_key_order_included(monkeypatch: pytest.MonkeyPatch, merge_every: int) -> None:
    monkeypatch.setattr(token_freq, "MERGE_EVERY", merge_every)
    for seed in range(3):
        rows = _rows(seed)
        ours = token_freq.count_supervised(iter(rows))
        theirs = _counter_per_row(rows)
        assert ours == theirs and list(ours) == list(theirs)
        assert all(type(k) is int and type(v) is int for k, v in ours.items())


def test_no_supervised_token_counts_nothing() -> None:
    assert token_freq.count_supervised([]) == {}
    assert token_freq.count_supervised([([1, 2], [0, 0]), ([], [])]) == {}


def test_the_flat_count_is_the_per_row_counter_key_order_included() -> None:
    """The finish counts rows laid end to end (``count_flat``): the same dict as the per-row Counter."""
    for seed in range(3):
        rows = _rows(seed)
        lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int64)
        flat_ids = np.array([i for ids, _ in rows for i in ids], dtype=np.int64)
        flat_mask = np.array([int(m) for _, mask in rows for m in mask], dtype=np.int64)
        ours = token_freq.count_flat(flat_ids, flat_mask, lengths)
        theirs = _counter_per_row(rows)
        assert ours == theirs and list(ours) == list(theirs)
        assert all(type(k) is int and type(v) is int for k, v in ours.items())
    empty = np.empty(0, dtype=np.int64)
    assert token_freq.count_flat(empty, empty, empty) == {}


def test_the_file_just_written_is_not_read_back_but_any_change_to_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / token_freq.TOKEN_FREQ_FILE
    token_freq.write(path, {7: 2, 3: 1})
    loads: list[Path] = []
    real_read = token_freq.read

    def counted_read(where: Path) -> dict[int, int]:
        loads.append(where)
        return real_read(where)

    monkeypatch.setattr(token_freq, "read", counted_read)
    assert token_freq.read_as_written(path) == {7: 2, 3: 1} and not loads
    other = tmp_path / "other.pt"
    torch.save({1: 1}, other)
    assert token_freq.read_as_written(other) == {1: 1} and loads == [other]
    torch.save({9: 9}, path)  # replaced in place by someone else: read again
    assert token_freq.read_as_written(path) == {9: 9} and loads[-1] == path
