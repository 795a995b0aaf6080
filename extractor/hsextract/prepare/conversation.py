"""A dataset row as a conversation: where its turns are, and the checks every row passes first.

Accepted rows (JSON objects, Parquet or Arrow records):

- ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|"system"|"tool", "value": "..."}]}``
- OpenAI / SpecForge: ``{"messages" | "conversations": [{"role": "user"|"assistant"|"system"|"tool",
  "content": "..."}]}``, with optional ``tool_calls``, ``tool_call_id``, ``reasoning_content`` / ``thinking``
- an optional ``id`` and an optional ``tools`` list (or its JSON text), given to the chat template.

How each trainer then turns the turns into messages lives beside its convention (``specforge.py``,
``speculators.py``): the two normalize differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hsextract.contract.states import ErrorReason

#: each accepted role name and the role it stands for
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


class Reason:
    """Why a row gave no output row: the ``reason`` of its errors file record and of the counts."""

    NOT_JSON = ErrorReason.NOT_JSON.value  # one spelling with extract's errors.jsonl and hsextract_errors_total
    NOT_OBJECT = "not an object"
    NO_CONVERSATION = "no conversations or messages field"
    NOT_LIST = "conversation not a list"
    EMPTY = "empty conversation"
    TURN_NOT_OBJECT = "turn not an object"
    UNKNOWN_ROLE = "unknown role"
    CONTENT_NOT_TEXT = "content not text"
    NO_USER_TURN = "no user turn"
    NOT_PREFIX_STABLE = "template not prefix-stable"
    TEMPLATE_FAILED = "template failed"
    NO_SUPERVISED_TOKEN = "no supervised token"


class BadRow(Exception):
    """A row that gives no output row; the run records it (reason, message) and goes on."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Conversation:
    """A row that passed the checks: its turns as given, the tools for its template, its input row."""

    source_row: int
    turns: list[dict[str, Any]]
    tools: list[Any] | None


def _role(turn: dict[str, Any]) -> Any:
    return turn["role"] if turn.get("role") is not None else turn.get("from")


def _tools(value: Any) -> list[Any] | None:
    """A ``tools`` field as both trainers read it: a list, or JSON text of one; anything else is no tools."""
    if isinstance(value, str) and value:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) and value else None


def conversation_of(source_row: int, raw: Any) -> Conversation:
    """The row's conversation, or :class:`BadRow` saying what is wrong with it."""
    if isinstance(raw, BadRow):
        raise raw
    if not isinstance(raw, dict):
        raise BadRow(Reason.NOT_OBJECT, f"row {source_row}: expected an object with conversations or messages, "
                     f"got {type(raw).__name__}")
    field = "conversations" if raw.get("conversations") is not None else "messages"
    turns = raw.get(field)
    if turns is None:
        keys = ", ".join(sorted(str(k) for k in raw)) or "none"
        raise BadRow(Reason.NO_CONVERSATION, f"row {source_row}: no conversations or messages field (fields: {keys})")
    if hasattr(turns, "tolist"):
        turns = turns.tolist()
    if not isinstance(turns, list):
        raise BadRow(Reason.NOT_LIST, f"row {source_row}: {field} is {type(turns).__name__}, not a list of turns")
    if not turns:
        raise BadRow(Reason.EMPTY, f"row {source_row}: {field} is empty")
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadRow(Reason.TURN_NOT_OBJECT, f"row {source_row}: turn {index} is {type(turn).__name__}, not an object")
        for key in ("role", "from"):
            if turn.get(key) is not None and turn[key] not in ROLES:
                raise BadRow(
                    Reason.UNKNOWN_ROLE,
                    f"row {source_row}: turn {index} has {key} {turn[key]!r}; known roles: {', '.join(ROLES)}",
                )
        if turn.get("role") is None and turn.get("from") is None:
            raise BadRow(Reason.UNKNOWN_ROLE, f"row {source_row}: turn {index} has neither role nor from")
        for key in ("content", "value"):
            if turn.get(key) is not None and not isinstance(turn[key], str):
                raise BadRow(
                    Reason.CONTENT_NOT_TEXT,
                    f"row {source_row}: turn {index} {key} is {type(turn[key]).__name__}, not text "
                    "(multimodal content is not supported)",
                )
    if not any(ROLES[_role(turn)] == "user" for turn in turns):
        raise BadRow(Reason.NO_USER_TURN, f"row {source_row}: no user turn among {len(turns)} turns")
    return Conversation(source_row, turns, _tools(raw.get("tools")))
