"""A batch of whole prompts as one right-padded ``[rows, length]`` id tensor, and each request's real rows picked
back out of the forward's ``[rows, length, ...]`` outputs.

Right padding, and for a CUDA graph's bucket whole rows of it (``forward_graphs.bucket``): causal attention keeps
every real token from seeing the pad, and positions stay 0..L-1, so a request's states are its states alone.

Both run on the engine's one scheduler thread for every batch, so neither walks the tokens in Python: the ids go
into the tensor in one copy and the flat positions of the real tokens come from a few array operations. (On an
H200 with short rows the per-prompt tensors and a comprehension over the positions were 0.14 of the server's
interpreter-lock samples; on a 2-core CPU, 6 prompts of 200-900 tokens: padding 223 -> 156 us, picking 277 -> 50.)
Those operations are numpy's, not torch's: torch runs an index of a few thousand elements on its intra-op threads,
and on a 16-core host every batch woke 15 of them, which then spun waiting for more work (on one H200 the server
burned 46 ms of user CPU a wide row, against 7 before, and left the extractor's processes fewer cores).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: the rows of some requests from a padded ``[rows, length, ...]`` tensor, as ``[n, ...]``
Rows = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PaddedBatch:
    ids: torch.Tensor  # [padded rows, padded length] int64 on the host (pinned for a GPU), pad 0
    lengths: list[int]  # each request's tokens, in batch order

    @classmethod
    def of(cls, prompts: Sequence[Sequence[int]], shape: tuple[int, int] | None = None, pin: bool = False) -> PaddedBatch:
        """``prompts`` right-padded to ``shape`` (rows, length), or to their own count and longest length."""
        lengths = [len(p) for p in prompts]
        rows, length = shape if shape is not None else (len(prompts), max(lengths))
        ids = torch.empty((rows, length), dtype=torch.int64, pin_memory=pin)
        flat = ids.numpy().reshape(-1)
        flat.fill(0)
        every_id = np.fromiter(itertools.chain.from_iterable(prompts), dtype=np.int64, count=sum(lengths))
        flat[_flat_positions(range(len(prompts)), lengths, length)] = every_id
        return cls(ids, lengths)

    @property
    def slots(self) -> int:
        """Token slots the forward computes, padding included."""
        return int(self.ids.numel())

    def picker(self, members: list[int], device: torch.device, own_outputs: bool = True) -> tuple[Rows, torch.Tensor]:
        """How to take the rows of ``members`` (request indexes) from the forward's outputs, and their ids ``[n]``.
        ``own_outputs`` False: the outputs are a CUDA graph's, overwritten by its next replay, so the rows are
        always copied out (``index_select``), never handed on as a view."""
        padded_rows, padded_length = (int(n) for n in self.ids.shape)
        lengths = self.lengths
        index: torch.Tensor | None = None  # None: every row is real and wanted, and the outputs are this batch's own
        whole = len(members) == padded_rows and all(lengths[i] == padded_length for i in members)
        ids = self.ids.reshape(-1)
        if not (own_outputs and whole):
            positions = _flat_positions(members, [lengths[i] for i in members], padded_length)
            ids = torch.from_numpy(ids.numpy().take(positions))
            index = torch.from_numpy(positions)
            index = (index.pin_memory() if self.ids.is_pinned() else index).to(device, non_blocking=True)

        def rows(tensor: torch.Tensor) -> torch.Tensor:
            flat = tensor.reshape(padded_rows * padded_length, -1)
            return flat if index is None else flat.index_select(0, index)

        return rows, ids


def _flat_positions(members: Sequence[int], counts: list[int], padded_length: int) -> np.ndarray:
    """The flat positions ``member * padded_length + 0..count-1`` of each member's tokens, in order, as ``[sum(counts)]``."""
    count = np.array(counts, dtype=np.int64)
    first = np.array(members, dtype=np.int64) * padded_length
    before = np.cumsum(count) - count  # each member's first place in the result
    return np.repeat(first - before, count) + np.arange(int(count.sum()), dtype=np.int64)
