"""The decode KV cache in fixed buffers: each row's tokens at columns ``[0, length)``, one column written a step.

The other layout (:mod:`~hsextract.capture.embedded.kv_batch`, transformers' ``DynamicCache``) grows every
layer's keys and values by concatenation, so a decode step's tensors change shape every step and no CUDA
graph can replay it. Here a layer's keys are one buffer ``[rows, kv_heads, columns, head_dim]`` allocated
for the running rows at their longest (prompt plus ``max_new_tokens``, rounded up to
:data:`COLUMN_STEP`; rows rounded up to a power of two): a step writes each row's new key at that row's
own length (:meth:`StepCache.update`, an indexed write), and an additive mask ``[rows, 1, 1, columns]``
keeps every row to its own columns. Rows are not padded on the left, so a row's position ids are its
column numbers.

Rows join after their prefill (:meth:`StaticKV.join`: the prefill cache's rows copied into the next
free rows, one indexed copy a layer) and leave when finished (:meth:`StaticKV.keep`: the rows that stay are
moved to the front, in order). The buffers are reallocated only when the running rows need more rows or
columns than they hold, and then for every request the scheduler has admitted (``planned``), not only this
prefill's: a burst that the prefill budget splits into several forwards is allocated once. They are kept when rows
leave, even the last (a graph of the step stays valid for the next requests), and grown to the larger of
what they hold and what is needed while that stays within the budget (else to what is needed alone);
:meth:`StaticKV.release` frees them (the scheduler does when it has been idle a while). Between
reallocations, the step's inputs have fixed shapes for a given row count.

The forward sees :class:`StepCache`, a duck-typed cache: transformers calls only its ``update`` when the
mask is already 4D and the position ids are given (``create_causal_mask`` returns a 4D mask as it is).
Its signature takes whatever transformers 5.x passes after the layer index (``cache_kwargs`` in some
releases, ``kwargs=`` in others).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: the model's step: (ids [rows, 1], additive mask [rows, 1, 1, columns], position ids [rows, 1], the cache) ->
#: the rows' final states [rows, hidden]
StepForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "StepCache"], torch.Tensor]
#: a buffer's column count is a multiple of this, so rows of other lengths joining rarely reallocate it
COLUMN_STEP = 64


_ALLOCATIONS = itertools.count()


def padded_rows(rows: int) -> int:
    """Rows a buffer holds for ``rows`` running rows: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def padded_columns(columns: int) -> int:
    return -(-columns // COLUMN_STEP) * COLUMN_STEP


def slots(rows: int, longest: int) -> int:
    """KV token slots the buffers hold for ``rows`` rows of at most ``longest`` tokens (the budget's unit)."""
    return padded_rows(rows) * padded_columns(longest) if rows else 0


class StaticKV:
    """Every layer's key and value buffer of the running rows, each row's length (tokens in the cache), and
    the step's fixed input tensors (last tokens, positions), allocated with the buffers."""

    def __init__(self, budget: int | None = None) -> None:
        #: token slots (rows x columns) the buffers may hold when grown beyond what the running rows need
        self.budget = budget
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # per running row, in row order
        #: new whenever the buffers are reallocated, unique in the process (a scheduler that starts over after a
        #: failed forward makes a new StaticKV): a graph captured on other buffers is stale
        self.generation = next(_ALLOCATIONS)
        self._ids = self._positions = self._row_index = self._column_index = torch.empty(0)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, columns) the buffers hold."""
        return (int(self.keys[0].shape[0]), int(self.keys[0].shape[2])) if self.keys else (0, 0)

    def join(self, prefill: Any, rows: Sequence[int], lengths: Sequence[int], longest: int, planned: int = 0) -> None:
        """Append rows ``rows`` of a right-padded prefill cache (row ``rows[j]``'s real tokens are
        ``[:lengths[j]]``); ``longest``: the most tokens any running or planned row will hold (prompt plus
        ``max_new_tokens``); ``planned``: the rows the buffers should hold (running, joining and admitted
        requests still to be prefilled), when more than the running and joining ones."""
        layers = prefill.layers
        start, count = self.rows, len(rows)
        self._fit(max(planned, start + count), longest, layers)
        # the columns past a row's length hold the prefill's padding: the mask hides them until the row's
        # steps overwrite them, one column a step
        columns = min(int(layers[0].keys.shape[2]), self.capacity[1])
        every = list(rows) == list(range(int(layers[0].keys.shape[0])))
        index = None if every else torch.tensor(list(rows), dtype=torch.int64, device=layers[0].keys.device)
        for buffers, name in ((self.keys, "keys"), (self.values, "values")):
            for layer, buffer in enumerate(buffers):
                new = getattr(layers[layer], name)
                joining = new if index is None else new.index_select(0, index)
                buffer[start : start + count, :, :columns] = joining[:, :, :columns]
        self.lengths.extend(lengths)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order), moved to the front; the buffers stay allocated."""
        if list(rows) == list(range(self.rows)):
            return
        if rows:
            index = torch.tensor(list(rows), dtype=torch.int64, device=self.keys[0].device)
            for buffers in (self.keys, self.values):
                for tensor in buffers:
                    tensor[: len(rows)] = tensor.index_select(0, index)
        self.lengths = [self.lengths[i] for i in rows]

    def release(self) -> None:
        """Free the buffers (no row may be running)."""
        assert not self.lengths, "release with rows running"
        self.keys, self.values = [], []
        self.generation = next(_ALLOCATIONS)

    def load(self, last_tokens: Sequence[int]) -> None:
        """The step's inputs into the fixed tensors: each running row's last token (not yet in the cache) and
        its position (its column: the row's length); the buffer rows past the running ones, token 0 at column 0."""
        pad = self.capacity[0] - self.rows
        host = torch.tensor([[*last_tokens, *[0] * pad], [*self.lengths, *[0] * pad]], dtype=torch.int64)
        self._ids.copy_(host[0].view(-1, 1))
        self._positions.copy_(host[1].view(-1, 1))

    def step(self, forward: StepForward, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """One decode step of the first ``rows`` buffer rows (all of them when a graph captures it): their
        final states ``[rows, hidden]``. The mask is built on the device from the positions, so a captured
        step reads nothing but the fixed input tensors and the buffers."""
        positions = self._positions[:rows]
        allowed = (self._column_index <= positions).view(rows, 1, 1, -1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return forward(self._ids[:rows], mask, positions, StepCache(self, rows))

    def advance(self) -> None:
        """Every running row holds one more token (the step's)."""
        self.lengths = [n + 1 for n in self.lengths]

    def _fit(self, rows: int, longest: int, layers: Sequence[Any]) -> None:
        """Reallocate the buffers when they hold fewer than ``rows`` rows or ``longest`` columns (running rows copied):
        to the larger of each, or to what is needed alone when that would pass the budget."""
        have_rows, have_columns = self.capacity
        if rows <= have_rows and longest <= have_columns:
            return
        need_rows, need_columns = padded_rows(rows), padded_columns(longest)
        want_rows, want_columns = max(have_rows, need_rows), max(have_columns, need_columns)
        if self.budget is not None and want_rows * want_columns > self.budget:
            want_rows, want_columns = need_rows, need_columns
        old, kept = self.rows, min(have_columns, want_columns)  # running rows fit in what is needed
        grown: list[list[torch.Tensor]] = [[], []]
        for layer_index, layer in enumerate(layers):
            for kind, like in enumerate((layer.keys, layer.values)):
                shape = (want_rows, int(like.shape[1]), want_columns, int(like.shape[3]))
                buffer = like.new_zeros(shape)
                if old:
                    previous = (self.keys, self.values)[kind][layer_index]
                    buffer[:old, :, :kept] = previous[:old, :, :kept]
                grown[kind].append(buffer)
        self.keys, self.values = grown
        device = grown[0][0].device
        self._ids = torch.zeros((want_rows, 1), dtype=torch.int64, device=device)
        self._positions = torch.zeros((want_rows, 1), dtype=torch.int64, device=device)
        self._row_index = torch.arange(want_rows, device=device)
        self._column_index = torch.arange(want_columns, device=device).view(1, -1)
        self.generation = next(_ALLOCATIONS)


class StepCache:
    """What a decode step's forward writes its new keys and values through: each row's at its own column."""

    def __init__(self, kv: StaticKV, rows: int) -> None:
        self._kv = kv
        self._count = rows
        self._rows = kv._row_index[:rows]
        self._columns = kv._positions[:rows].view(-1)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's key and value of every row (``[rows, heads, 1, dim]``) at its column; every column back."""
        keys, values = self._kv.keys[layer_idx], self._kv.values[layer_idx]
        keys[self._rows, :, self._columns] = key_states[:, :, 0]
        values[self._rows, :, self._columns] = value_states[:, :, 0]
        return keys[: self._count], values[: self._count]
