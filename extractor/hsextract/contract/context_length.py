"""The served model's context length, and the longest prompt a server of it takes.

SGLang refuses a prompt of as many tokens as the context length or more (HTTP 400, "longer than or equal to the
model's context length"), and the embedded server's generation does the same: a prompt fits when it is shorter
than the context. The context length is the server's own word (SGLang's ``--context-length``, the embedded
server's ``/server_info`` ``context_length``), else the model's ``max_position_embeddings``, which is SGLang's
default for the models this bundle serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_length_of(server_info: Mapping[str, Any], model_config: Mapping[str, Any]) -> int | None:
    """The context length a server reports, else the one its model's config.json gives; None when neither says
    (the embedded server reports 0 for a config without ``max_position_embeddings``)."""
    return _positive_int(server_info.get("context_length")) or _positive_int(model_config.get("max_position_embeddings"))


def longest_prompt(context_length: int) -> int:
    """The most tokens a prompt may have on a server of ``context_length``."""
    return context_length - 1
