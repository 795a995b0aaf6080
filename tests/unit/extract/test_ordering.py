"""Requests leave shortest first within blocks of rows read ahead; every row leaves exactly once."""

from __future__ import annotations

from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError
from hsextract.extract.planning.ordering import shortest_first


def rows(lengths: list[int]) -> list[tuple[int, object]]:
    return [(row, {"input_ids": [1] * n}) for row, n in enumerate(lengths)]


def test_each_block_leaves_shortest_first_and_blocks_in_order() -> None:
    lengths = [5, 3, 9, 1, 7, 2, 8]
    out = list(shortest_first(iter(rows(lengths)), window=3))
    assert [row for row, _ in out] == [1, 0, 2, 3, 5, 4, 6]
    assert sorted(row for row, _ in out) == list(range(len(lengths)))


def test_equal_lengths_keep_dataset_order_and_window_one_changes_nothing() -> None:
    lengths = [4, 4, 2, 4]
    assert [r for r, _ in shortest_first(iter(rows(lengths)), window=10)] == [2, 0, 1, 3]
    assert [r for r, _ in shortest_first(iter(rows(lengths)), window=1)] == [0, 1, 2, 3]


def test_bad_rows_go_first_and_still_leave() -> None:
    items = [(0, {"input_ids": [1, 2]}), (1, BadSampleError(ErrorReason.NOT_JSON, "x")), (2, "text"), (3, {"input_ids": 5})]
    assert [r for r, _ in shortest_first(iter(items), window=8)] == [1, 2, 3, 0]
