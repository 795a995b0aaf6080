"""The KV cache of the requests decoding together: one transformers ``DynamicCache``, rows padded on the left.

Every row's real tokens end at the last column, so one decode step appends one column for all rows;
``mask`` (``[B, T]``, 1 on a real token) keeps the pad columns out of attention, and each row's
position ids are its own count of real tokens (the caller passes them), so a row attends and rotates
exactly as it would alone. Rows join after their prefill (:meth:`KVBatch.join`: the cache is re-laid
once, with the new rows' real tokens moved to the right end) and leave when finished
(:meth:`KVBatch.keep`: their rows dropped, then the leading columns that are padding in every row
that stays). Between those, a step costs what transformers' own ``DynamicCache`` costs.

The padded cache holds ``B * T`` token slots; T never exceeds the longest running request's
prompt plus its ``max_new_tokens`` (the leading all-pad columns are trimmed whenever a row leaves),
which is what the decode scheduler's token budget counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hsextract.errors import ConfigError


def throwaway_cache(config: Any) -> Any:
    """An empty KV cache for a whole-prompt forward. Without a cache (and without a mask),
    transformers checks the position ids for packed sequences and reads the answer back from
    the device: a synchronization in every forward, which would stall the queue of forwards."""
    import transformers

    return transformers.DynamicCache(config=config)


def check_layers(cache: Any) -> None:
    """Refuse a cache whose layers are not plain growing layers (sliding-window, quantized, linear attention)."""
    from transformers.cache_utils import DynamicLayer

    odd = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
    if odd:
        raise ConfigError(f"the embedded server decodes with plain DynamicLayer caches only; this model uses {', '.join(odd)}")


class KVBatch:
    """The running rows' cache and attention mask (empty when nobody decodes)."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, T] int64, on the device

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def join(self, prefill: Any, lengths: Sequence[int]) -> None:
        """Append the rows of a right-padded prefill cache (row ``j``'s real tokens are ``[:lengths[j]]``)."""
        old_rows, old_columns = self.rows, self.columns
        columns = max(old_columns, *lengths)
        rows = old_rows + len(lengths)
        mask = torch.zeros((rows, columns), dtype=torch.int64, device=prefill.layers[0].keys.device)
        if self.mask is not None:
            mask[:old_rows, columns - old_columns :] = self.mask
        for j, length in enumerate(lengths):
            mask[old_rows + j, columns - length :] = 1
        if self.cache is None:
            self.cache = prefill
            for layer in prefill.layers:
                layer.keys, layer.values = (self._relaid(t, None, 0, lengths, columns) for t in (layer.keys, layer.values))
        else:
            for layer, new in zip(self.cache.layers, prefill.layers, strict=True):
                layer.keys = self._relaid(new.keys, layer.keys, old_rows, lengths, columns)
                layer.values = self._relaid(new.values, layer.values, old_rows, lengths, columns)
        self.mask = mask

    @staticmethod
    def _relaid(new: torch.Tensor, old: torch.Tensor | None, old_rows: int, lengths: Sequence[int], columns: int) -> torch.Tensor:
        heads, width = int(new.shape[1]), int(new.shape[-1])
        out = new.new_zeros((old_rows + len(lengths), heads, columns, width))
        if old is not None:
            out[:old_rows, :, columns - int(old.shape[2]) :] = old
        for j, length in enumerate(lengths):
            out[old_rows + j, :, columns - length :] = new[j, :, :length]
        return out

    def step_mask(self) -> torch.Tensor:
        """The mask for one more column (the step's new token), kept as the batch's mask."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.rows, 1))], dim=1)
        return self.mask

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order), then trim the columns that are padding in all of them."""
        if not rows:
            self.cache, self.mask = None, None
            return
        assert self.mask is not None
        if len(rows) == self.rows and list(rows) == list(range(self.rows)):
            return
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        first = int(torch.argmax(mask.amax(dim=0)).item())  # the first column some row still uses
        self.mask = mask[:, first:].contiguous()
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
