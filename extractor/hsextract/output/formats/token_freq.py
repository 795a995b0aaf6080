"""``<out>/data/token_freq.pt``: the draft vocabulary's input for speculators' trainer.

speculators 0.9.0 builds its draft vocabulary (``d2t``/``t2d`` for ``--draft-vocab-size``) from
``<data-path>/token_freq.pt``, a ``torch.save``d dict token id -> count over the loss-masked
``input_ids`` (``speculators.train.vocab_mapping.save_token_frequency_distribution``); without the file
it warns and trains a full-vocabulary drafter. The counting here walks the rows in the order of
``data/`` and adds each row's sorted unique supervised ids, as that function does, so the dict is the
same, key order included. A merged output sums its shards' files (``combine_token_frequency_distributions``).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from hsextract.durable.atomic import atomic_write_bytes

TOKEN_FREQ_FILE = "token_freq.pt"


def count_supervised(rows: Iterable[tuple[Sequence[int], Sequence[int]]]) -> dict[int, int]:
    """Token id -> count over the tokens whose loss mask is set, rows of ``(input_ids, loss_mask)`` in order."""
    counts: Counter[int] = Counter()
    for input_ids, loss_mask in rows:
        if not input_ids:
            continue
        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        masked = ids[torch.as_tensor(loss_mask).to(torch.bool)]
        unique, per_id = torch.unique(masked, sorted=True, return_counts=True)
        counts.update(dict(zip(unique.tolist(), per_id.tolist(), strict=True)))
    return dict(counts)


def combine(distributions: Iterable[dict[int, int]]) -> dict[int, int]:
    """The sum of several distributions (shards), in the order given."""
    total: Counter[int] = Counter()
    for distribution in distributions:
        total.update(distribution)
    return dict(total)


def write(path: Path, distribution: dict[int, int]) -> None:
    buffer = io.BytesIO()
    torch.save(distribution, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def read(path: Path) -> dict[int, int]:
    loaded = torch.load(path, weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} holds a {type(loaded).__name__}, not a dict of token id -> count")
    return {int(k): int(v) for k, v in loaded.items()}
