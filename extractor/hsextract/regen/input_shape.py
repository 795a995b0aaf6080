"""What ``regenerate`` refuses before any request: an input with no conversation among its first rows.

Token rows (``input_ids``, what ``prepare`` writes) or an empty file would otherwise have every row
failed one by one, an empty output written and ``prepare`` suggested on it; as ``extract`` refuses
conversations, ``regenerate`` refuses what is not conversations (exit 2).
"""

from __future__ import annotations

import itertools
from typing import Any

from hsextract.errors import ConfigError
from hsextract.extract.planning.dataset_shape import CONVERSATION_FIELDS, SHAPE_ROWS
from hsextract.prepare.readers import InputDataset


def _is_conversation(raw: Any) -> bool:
    return isinstance(raw, dict) and any(isinstance(raw.get(name), list) for name in CONVERSATION_FIELDS)


def check_conversations(source: InputDataset, rows: int = SHAPE_ROWS) -> None:
    """ConfigError unless at least one of the first ``rows`` rows is a conversation."""
    first = [raw for _, raw in itertools.islice(source.iter_rows(), rows)]
    if any(_is_conversation(raw) for raw in first):
        return
    fields = " or ".join(CONVERSATION_FIELDS)
    if not first:
        what = "has no rows (it is empty, or holds only blank lines)"
    else:
        tokens = sum(1 for raw in first if isinstance(raw, dict) and raw.get("input_ids") is not None)
        held = f", {tokens} of them token rows (input_ids: a prepared dataset)" if tokens else ""
        what = f"holds no conversation: none of its first {len(first)} rows has a {fields} list{held}"
    raise ConfigError(
        f"--dataset {source.path} {what}; nothing was sent. regenerate answers conversations (ShareGPT "
        f"conversations or OpenAI messages, the input of hsextract prepare): give those, not prepared token rows"
    )
