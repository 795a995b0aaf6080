"""Requests leave shortest first within blocks of rows read ahead; every row leaves exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError
from hsextract.extract.planning.ordering import FIRST_BLOCK, read_ahead, shortest_first


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


def test_blocks_start_small_and_double_up_to_the_window() -> None:
    lengths = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 10]
    out = [row for row, _ in shortest_first(iter(rows(lengths)), window=4, first_block=1)]
    # blocks of 1, 2, 4, 4, then the last row alone
    assert out == [0, 2, 1, 6, 5, 4, 3, 9, 8, 7, 10, 11]


def test_the_first_row_leaves_before_a_whole_window_is_read() -> None:
    """The first request left only after a whole window (2048 rows) was read and sorted: on one H100 1.7-2.0 s of a
    3000-row run's start with the GPU idle. Now the first block is small, and the next is read while it leaves."""
    read = 0

    def counted() -> Iterator[tuple[int, object]]:
        nonlocal read
        for item in rows([5] * 5000):
            read += 1
            yield item

    ordered = shortest_first(counted(), window=2048)
    next(ordered)
    assert read <= FIRST_BLOCK * 3  # the first block, the next one read ahead, and the row being read
    assert sorted(row for row, _ in [(0, None), *ordered]) == list(range(5000))


def test_read_ahead_raises_at_the_item_it_could_not_make() -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("row 3 unreadable")

    got: list[int] = []
    with pytest.raises(ValueError, match="row 3 unreadable"):
        for item in read_ahead(failing(), name="test-read-ahead"):
            got.append(item)
    assert got == [1, 2]


def test_read_ahead_makes_one_item_ahead_and_its_thread_ends_when_the_caller_stops() -> None:
    made = 0

    def counted() -> Iterator[int]:
        nonlocal made
        for item in range(100):
            made += 1
            yield item

    items = read_ahead(counted(), name="test-read-ahead-stop")
    assert next(items) == 0
    assert next(items) == 1
    deadline = time.monotonic() + 2
    while made < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert made == 3  # the caller's item, and one ahead: no more
    items.close()
    deadline = time.monotonic() + 5
    while any(t.name == "test-read-ahead-stop" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "test-read-ahead-stop" for t in threading.enumerate())
    assert made == 3
