"""speculators' ``data/`` columns built from flat arrays: one entry per dataset row, holes where no file is.

The rows' ids and masks are laid end to end in numpy (each row's lists made an array as the row comes) and handed
to ``datasets`` as Arrow list arrays, which it casts without a look at each value. ``Dataset.from_dict`` of Python
lists encodes every row in Python first: 0.32 s of a 3000-row run's finish (2.5 M tokens) on the CI machine's CPU,
against 0.19 s this way (bench/results-finish-cpu.json). The same flat arrays count ``token_freq.pt``
(:func:`token_freq.count_flat`).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hsextract.output.formats import token_freq
from hsextract.output.sample import Sample

#: each row's ids and mask as arrays (int64), by row
RowArrays = dict[int, tuple[np.ndarray, np.ndarray]]

#: most values in one Arrow list array: its offsets are 32-bit, so a larger column is cut into chunks of whole rows
CHUNK_VALUES = (1 << 31) - 1


@dataclass(frozen=True)
class IndexColumns:
    """Entry i is dataset row i: its ids and mask (flat, entry after entry), its length and whether it was written."""

    input_ids: np.ndarray  # int64, every written row's ids end to end
    loss_mask: np.ndarray  # int64, aligned with input_ids
    seq_len: np.ndarray  # int64 [entries]: 0 for a hole
    written: np.ndarray  # bool [entries]

    @classmethod
    def of(cls, samples: Iterable[Sample], written_rows: set[int]) -> IndexColumns:
        """From the rows' samples in any order (the last of a row counts), those in ``written_rows`` only. Each row
        is made arrays as it comes: its lists are not kept, so a long run's index holds 16 bytes a token, not about 44."""
        return cls.of_arrays(row_arrays(samples, written_rows), written_rows)

    @classmethod
    def of_arrays(cls, by_row: RowArrays, written_rows: set[int]) -> IndexColumns:
        """From rows already made arrays (:func:`row_arrays`), those in ``written_rows`` only."""
        rows = sorted(written_rows.intersection(by_row))
        entries = rows[-1] + 1 if rows else 0
        seq_len = np.zeros(entries, dtype=np.int64)
        seq_len[rows] = [by_row[row][0].size for row in rows]
        written = np.zeros(entries, dtype=bool)
        written[rows] = True
        empty = np.empty(0, dtype=np.int64)
        input_ids = np.concatenate([empty, *(by_row[row][0] for row in rows)])
        loss_mask = np.concatenate([empty, *(by_row[row][1] for row in rows)])
        return cls(input_ids, loss_mask, seq_len, written)

    def token_freq(self) -> dict[int, int]:
        return token_freq.count_flat(self.input_ids, self.loss_mask, self.seq_len)

    def arrow(self) -> dict[str, Any]:
        """``Dataset.from_dict``'s mapping: the two list columns as Arrow arrays, chunked under :data:`CHUNK_VALUES`."""
        import pyarrow as pa

        return {
            "input_ids": _list_column(self.input_ids, self.seq_len),
            "loss_mask": _list_column(self.loss_mask, self.seq_len),
            "seq_len": pa.array(self.seq_len),
            "written": pa.array(self.written),
        }


def row_arrays(samples: Iterable[Sample], rows: Container[int] | None = None) -> RowArrays:
    """Each sample's ids and mask as arrays, by row (the last of a row counts); of ``rows`` only, when given."""
    return {
        sample.row: (np.array(sample.input_ids, dtype=np.int64), np.array(sample.loss_mask, dtype=np.int64))
        for sample in samples
        if rows is None or sample.row in rows
    }


def _list_column(values: np.ndarray, lengths: np.ndarray) -> Any:
    import pyarrow as pa

    ends = np.cumsum(lengths)
    chunks: list[Any] = []
    first = start = 0
    while first < len(lengths) or not chunks:
        # the rows whose values end within this chunk's room; at least one, however long
        last = max(int(np.searchsorted(ends, start + CHUNK_VALUES, side="right")), first + 1)
        last = min(last, len(lengths))
        offsets = np.concatenate(([0], ends[first:last] - start)).astype(np.int32)
        end = start + int(offsets[-1])
        chunks.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[start:end])))
        first, start = last, end
    return pa.chunked_array(chunks, type=pa.list_(pa.int64()))
