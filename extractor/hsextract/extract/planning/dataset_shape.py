"""What a dataset holds, read from its first rows before any request: token ids, or conversations that
must be tokenized first (``hsextract prepare``), and whether its rows carry a ``loss_mask``.

A file of ShareGPT or OpenAI-style conversations given to ``extract`` would otherwise have every row
recorded as bad input; it is refused at once instead (exit 2), naming the command that tokenizes it. A
prepared dataset (a ``save_to_disk`` directory ``hsextract prepare`` wrote) carries its provenance in
``prepare.json``, which the output's identity and ``data_config.json`` record.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError
from hsextract.extract.planning.dataset import iter_raw_rows

log = logging.getLogger(__name__)

#: rows the shape is read from
SHAPE_ROWS = 64
#: the fields conversations come in (ShareGPT, OpenAI / SpecForge style)
CONVERSATION_FIELDS = ("conversations", "messages")


@dataclass(frozen=True)
class DatasetShape:
    rows: int  # rows among the first (bad ones included): 0 for an empty file or one of blank lines
    rows_read: int  # JSON objects among the first rows
    with_input_ids: int
    conversations: int  # objects with a conversation field and no input_ids
    without_loss_mask: int  # objects with input_ids and no loss_mask


def read_shape(path: Path, rows: int = SHAPE_ROWS) -> DatasetShape:
    first = [raw for _, raw in itertools.islice(iter_raw_rows(path), rows)]
    objects = [raw for raw in first if isinstance(raw, dict)]
    with_ids = [o for o in objects if o.get("input_ids") is not None]
    conversations = [o for o in objects if o.get("input_ids") is None and _conversation_field(o) is not None]
    return DatasetShape(
        rows=len(first),
        rows_read=len(objects),
        with_input_ids=len(with_ids),
        conversations=len(conversations),
        without_loss_mask=sum(1 for o in with_ids if o.get("loss_mask") is None),
    )


def _conversation_field(row: dict[str, Any]) -> str | None:
    return next((name for name in CONVERSATION_FIELDS if isinstance(row.get(name), list)), None)


def check_shape(dataset: Path, require_loss_mask: bool) -> DatasetShape:
    """ConfigError (before any request) for a dataset with no row, of conversations, or of rows without
    loss_mask when they are required; a warning when rows without loss_mask are taken with every token supervised."""
    shape = read_shape(dataset)
    if not shape.rows:  # as prepare refuses it: an empty output would otherwise end COMPLETE
        raise ConfigError(
            f"dataset {dataset} has no rows (it is empty, or holds only blank lines); nothing was sent. Give a dataset "
            "of token rows (input_ids, loss_mask), e.g. one hsextract prepare wrote"
        )
    if shape.conversations and not shape.with_input_ids:
        raise ConfigError(
            f"dataset {dataset} holds conversations ({shape.conversations} of its first {shape.rows_read} rows have a "
            f"{' or '.join(CONVERSATION_FIELDS)} field and no input_ids), not token ids; tokenize them first with the "
            f"model's own tokenizer and chat template: hsextract prepare --model MODEL_DIR --dataset {dataset} "
            f"--output PREPARED (then --dataset PREPARED)"
        )
    if shape.without_loss_mask:
        share = f"{shape.without_loss_mask} of the first {shape.with_input_ids} rows"
        if require_loss_mask:
            raise ConfigError(
                f"dataset {dataset}: {share} have no loss_mask, and require_loss_mask (--require-loss-mask) is set; "
                "tokenize the conversations with hsextract prepare (assistant-only masks), or drop --require-loss-mask"
            )
        log.warning(
            "dataset %s: %s have no loss_mask; they are taken with every token supervised (prompts included), counted "
            "in data_config.json (samples_without_loss_mask, loss_mask_source). hsextract prepare makes assistant-only "
            "masks; --require-loss-mask refuses such rows",
            dataset,
            share,
        )
    return shape
