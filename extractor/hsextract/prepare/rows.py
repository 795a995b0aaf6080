"""What a convention makes of one conversation: its output rows, or why it gave none, and its counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from hsextract.prepare.conversation import BadRow, Conversation

#: ``turn`` of a SpecForge row: one row supervises every assistant turn
ALL_TURNS = -1


@dataclass(frozen=True)
class OutRow:
    input_ids: list[int]
    loss_mask: list[int]
    turn: int  # the assistant turn (index in the conversation) a speculators row supervises; ALL_TURNS for SpecForge
    truncated: bool


@dataclass
class Outcome:
    """One input row: the rows it gave, or the error that dropped it; ``notes`` counts what happened on the way."""

    source_row: int
    rows: list[OutRow] = field(default_factory=list)
    error: BadRow | None = None
    notes: Counter[str] = field(default_factory=Counter)


class Convention(Protocol):
    """Turns conversations into a trainer's rows (``specforge.py``, ``speculators.py``)."""

    name: str

    def prepare(self, conversations: list[Conversation]) -> list[Outcome]: ...


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens added (the chat template wrote them): one batched call."""
    if not texts:
        return []
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [list(ids) for ids in encoded]


def render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[Any] | None,
           **kwargs: Any) -> str:
    """The chat template's text of ``messages`` (``apply_chat_template``, as both trainers render)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools or None, **kwargs
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, not text")
    return text
