"""The static decode KV layout against the model itself: every step's last state equals a whole forward of the row."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from pydantic import ValidationError

from hsextract.capture.embedded import static_kv
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.embedded.static_kv import StaticKV
from hsextract.capture.embedded.step_graphs import StepGraphs
from hsextract.dev.tiny_model import make_tiny_model


@pytest.fixture(scope="module", params=["llama", "deepseek_v3"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = make_tiny_model(tmp_path_factory.mktemp(request.param), arch=request.param, layers=7, hidden=64, vocab_size=512,
                           dtype="float32")  # fmt: skip
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def cache_kwarg(model: Any) -> str:
    """transformers 5.x renames the cache argument model by model (as the decode scheduler reads it)."""
    return "cache" if "cache" in inspect.signature(model.base_model.forward).parameters else "past_key_values"


def whole(model: Any, ids: list[int]) -> torch.Tensor:
    """The row alone, one forward: its last token's final state."""
    with torch.inference_mode():
        state: torch.Tensor = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    return state


def prefill(
    model: Any, kv: StaticKV, rows: list[list[int]], longest: int, planned: int = 0, joining: list[int] | None = None
) -> None:
    """As the decode scheduler prefills: one right-padded forward on a DynamicCache, its rows joined (``joining``:
    only those, as when the others finished on their first token)."""
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        model.base_model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    joining = list(range(len(rows))) if joining is None else joining
    kv.join(cache, joining, [len(rows[i]) for i in joining], longest, planned=planned)


def step(model: Any, kv: StaticKV, rows: list[list[int]], padded: bool = False) -> torch.Tensor:
    """One decode step of every running row on its last token (not yet in the cache): the rows' final states.
    ``padded``: over every buffer row, as a captured graph runs it (the rows past the running ones are padding)."""

    def forward(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        assert positions.view(-1)[: len(rows)].tolist() == [len(r) - 1 for r in rows]  # a row's position is its column
        out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                               **{cache_kwarg(model): cache})  # fmt: skip
        states: torch.Tensor = out.last_hidden_state[:, -1]
        return states

    kv.load([r[-1] for r in rows])
    with torch.inference_mode():
        states = kv.step(forward, kv.capacity[0] if padded else kv.rows, torch.float32)
    kv.advance()
    return states[: len(rows)]


@pytest.mark.parametrize("padded", [False, True], ids=["running-rows", "every-buffer-row"])
def test_each_step_of_rows_joining_and_leaving_equals_each_row_alone(model: Any, padded: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (5, 11, 3)]
    kv = StaticKV()
    prefill(model, kv, rows, longest=20)
    assert kv.capacity == (4, static_kv.COLUMN_STEP)
    for turn in range(12):
        if turn == 3:  # the middle row leaves: the others move up, in order
            kv.keep([0, 2])
            rows = [rows[0], rows[2]]
        if turn == 5:  # a longer row joins: the buffers grow to its columns, the running rows copied across
            late = torch.randint(3, 500, (70,), generator=generator).tolist()
            prefill(model, kv, [late], longest=80)
            assert kv.capacity == (4, 2 * static_kv.COLUMN_STEP)
            rows.append(late)
        for row in rows:
            row.append(int(torch.randint(3, 500, (1,), generator=generator)))
        states = step(model, kv, rows, padded)
        for i, row in enumerate(rows):
            torch.testing.assert_close(states[i], whole(model, row), rtol=1e-4, atol=1e-4)
    assert kv.lengths == [len(r) for r in rows]
    kv.keep([])  # the last rows leave: the buffers stay for the next requests, until released
    assert kv.capacity == (4, 2 * static_kv.COLUMN_STEP) and kv.rows == 0
    generation = kv.generation
    kv.release()
    assert kv.capacity == (0, 0) and kv.generation != generation
    # a scheduler that starts over (a failed forward) makes a new one: no graph may take its buffers for the old
    first, again = StaticKV(), StaticKV()
    for fresh in (first, again):
        prefill(model, fresh, [[5, 6]], longest=4)
    assert first.generation != again.generation


def test_rows_join_buffers_that_earlier_rows_left(model: Any) -> None:
    """Rows that join kept buffers (and a prefill some of whose rows do not join) decode as each row alone, though
    the buffer rows and columns they take hold an earlier row's keys."""
    generator = torch.Generator().manual_seed(2)
    kv = StaticKV()
    first = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (30, 9)]
    prefill(model, kv, first, longest=40)
    for row in first:
        row.append(7)
    step(model, kv, first)
    kv.keep([])
    generation = kv.generation
    rows = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (4, 12, 6)]
    prefill(model, kv, rows, longest=40, joining=[0, 2])  # the middle row finished on its first token
    rows = [rows[0], rows[2]]
    assert kv.generation == generation  # no reallocation: a graph of the step stays valid
    for _ in range(4):
        for row in rows:
            row.append(int(torch.randint(3, 500, (1,), generator=generator)))
        states = step(model, kv, rows)
        for i, row in enumerate(rows):
            torch.testing.assert_close(states[i], whole(model, row), rtol=1e-4, atol=1e-4)


def test_buffers_are_sized_for_the_planned_rows_and_grow_within_the_budget(model: Any) -> None:
    column = static_kv.COLUMN_STEP
    kv = StaticKV(budget=16 * column)
    prefill(model, kv, [[5, 6, 7]], longest=10, planned=5)  # five admitted, one prefilled now
    assert kv.capacity == (8, column)
    generation = kv.generation
    prefill(model, kv, [[8, 9]] * 4, longest=10, planned=5)  # the rest of the burst: no reallocation
    assert (kv.capacity, kv.generation) == ((8, column), generation)
    kv.keep([0])
    prefill(model, kv, [[3] * 20], longest=column + 1)  # longer: grown, rows kept (8 x 2 columns fit)
    assert kv.capacity == (8, 2 * column) and kv.lengths == [3, 20]
    kv.keep([1])
    prefill(model, kv, [[4] * 30], longest=4 * column)  # 8 x 4 would pass the budget: what is needed alone
    assert kv.capacity == (2, 4 * column) and kv.lengths == [20, 30]
    rows = [[3] * 20 + [11], [4] * 30 + [12]]  # the running row was copied across both reallocations
    states = step(model, kv, rows)
    for i, row in enumerate(rows):
        torch.testing.assert_close(states[i], whole(model, row), rtol=1e-4, atol=1e-4)


def test_the_budget_counts_the_buffers_as_allocated() -> None:
    assert static_kv.slots(0, 100) == 0
    assert static_kv.slots(3, 65) == 4 * 128  # rows to a power of two, columns to COLUMN_STEP
    assert static_kv.slots(1, 64) == 64


def test_a_failed_step_capture_turns_decode_graphs_off_and_the_step_runs_eagerly(model: Any) -> None:
    """Here no GPU: capturing fails, as it would on one for an operator that cannot be captured."""
    kv = StaticKV()
    prefill(model, kv, [[5, 6, 7]], longest=8)
    graphs = StepGraphs(torch.device("cpu"))
    assert graphs.run(kv, lambda rows: torch.zeros(rows, 1)) is None
    assert not graphs.enabled and graphs.captured == 0
    assert graphs.run(kv, lambda rows: torch.zeros(rows, 1)) is None  # off: no second try


def test_decode_graphs_need_the_static_layout(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="decode_kv to static"):
        ServeConfig(model=tmp_path, dump_dir=tmp_path, decode_kv="dynamic", decode_graphs=True)
    default = ServeConfig(model=tmp_path, dump_dir=tmp_path)
    assert (default.decode_kv, default.decode_graphs) == ("static", True)  # measured on a GPU: docs/design-notes.md
    assert ServeConfig(model=tmp_path, dump_dir=tmp_path, decode_kv="dynamic").decode_kv == "dynamic"  # graphs unasked
