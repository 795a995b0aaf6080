"""The plan: a cheap estimate from the first rows before any request, the exact count behind it."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

from hsextract.extract.planning import plan as plan_module
from hsextract.extract.planning.dataset import iter_raw_rows
from hsextract.extract.planning.plan import Plan, Planner

VOCAB, MAX_LEN = 1000, 300


def write_rows(path: Path, lengths: list[int | None]) -> Path:
    rng = random.Random(0)
    with open(path, "w") as handle:
        for n in lengths:
            handle.write("{broken\n" if n is None else json.dumps({"input_ids": [rng.randrange(VOCAB) for _ in range(n)]}) + "\n")
    return path


def planner(path: Path, settled: set[int] | None = None, stop: threading.Event | None = None, **kw: object) -> Planner:
    return Planner(path, lambda: iter_raw_rows(path), settled or set(), VOCAB, MAX_LEN, stop=stop, **kw)  # type: ignore[arg-type]


def test_a_dataset_within_the_sample_is_counted_exactly_up_front(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "d.jsonl", [10, 400, None, 50])
    plan = planner(data, settled={3}, written_lengths=[120], trainer_default=100).estimate()
    assert plan == Plan(4, 2, 10 + MAX_LEN, 1, truncated_rows=1, longest_tokens=MAX_LEN, over_trainer_default=2, exact=True)


def test_a_large_dataset_is_estimated_from_its_first_rows_then_counted_exactly(tmp_path: Path) -> None:
    rng = random.Random(5)
    lengths: list[int | None] = [rng.randint(20, 400) for _ in range(1200)]
    lengths[700] = None
    data = write_rows(tmp_path / "d.jsonl", lengths)
    decoded: list[int] = []
    counting = planner(data, settled={1, 2}, trainer_default=250)
    original = counting._shard_rows

    def rows_seen() -> Iterator[tuple[int, object]]:
        for item in original():
            decoded.append(item[0])
            yield item

    counting._shard_rows = rows_seen
    estimate = counting.estimate()
    assert not estimate.exact and max(decoded) <= plan_module.SAMPLE_ROWS  # only the first rows were read
    assert abs(estimate.rows_in_shard - 1200) < 120 and estimate.settled == 2
    done: list[Plan] = []
    counting.start(done.append)
    exact = counting.result()
    todo = [n for i, n in enumerate(lengths) if n is not None and i not in (1, 2)]
    kept = [min(n, MAX_LEN) for n in todo]
    over_default = sum(1 for n in kept if n > 250)
    assert exact == Plan(1200, len(kept), sum(kept), 2, sum(1 for n in todo if n > MAX_LEN), MAX_LEN, over_default)
    assert done == [exact]
    assert abs(estimate.todo_tokens - exact.todo_tokens) < 0.15 * exact.todo_tokens


def test_a_stopped_run_keeps_the_estimate(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "d.jsonl", [30] * 900)
    stop = threading.Event()
    stop.set()
    stopped = planner(data, stop=stop)
    estimate = stopped.estimate()
    stopped.start()
    assert stopped.result() == estimate and not estimate.exact
