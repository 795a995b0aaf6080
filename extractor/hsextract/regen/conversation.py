"""One conversation regenerated: each assistant turn (or the last) answered again on its history.

The row keeps its schema: the turns keep their keys (ShareGPT ``from``/``value`` or ``role``/``content``),
a regenerated turn gets the answer in the key its text was in (``reasoning_content`` beside it with
``--reasoning split``; a ``thinking`` or ``reasoning_content`` the input turn had is dropped, as it
belonged to the old answer), every other field of the row is kept, and :data:`META_KEY` is added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hsextract.prepare.conversation import ROLES, BadRow, conversation_of
from hsextract.regen.client import DecodeAnswer
from hsextract.regen.prompts import Prompter, shape_answer

#: the row's regeneration metadata (its input row; per regenerated turn: its index, finish reason and generated tokens)
META_KEY = "regen"
NO_ASSISTANT_TURN = "no assistant turn"
TRUNCATED = "truncated turn"

#: sends one prompt (row's turn index, prompt ids) and returns the server's answer
Send = Callable[[int, list[int]], DecodeAnswer]


@dataclass
class Regenerated:
    row: dict[str, Any]
    finish_reasons: list[str] = field(default_factory=list)
    generated_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def truncated(self) -> bool:
        return "length" in self.finish_reasons


def _role(turn: dict[str, Any]) -> str:
    return ROLES[turn["role"] if turn.get("role") is not None else turn["from"]]


def turn_seed(seed: int, row: int, turn: int) -> int:
    """The sampling seed of one turn: a function of the run's seed, the row and the turn only, so a
    sampled run is the same at any concurrency and after a resume."""
    digest = hashlib.sha256(f"{seed}:{row}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # within SGLang's int64 range


def regenerate_row(
    source_row: int, raw: Any, prompter: Prompter, send: Send, turns: str, reasoning: str, meta: dict[str, Any]
) -> Regenerated:
    """The row with its assistant turns regenerated; :class:`BadRow` when it is no conversation to regenerate."""
    conversation = conversation_of(source_row, raw)
    assistant = [j for j, turn in enumerate(conversation.turns) if _role(turn) == "assistant"]
    if not assistant:
        raise BadRow(NO_ASSISTANT_TURN, f"row {source_row}: no assistant turn to regenerate among "
                     f"{len(conversation.turns)} turns")
    targets = assistant if turns == "all" else assistant[-1:]
    history = [dict(turn) for turn in conversation.turns]
    result = Regenerated(row={})
    per_turn = []
    for j in targets:
        prompt = prompter.prompt_ids(history[:j], conversation.tools)
        answer = send(j, prompt)
        shaped = shape_answer(prompter.decode(answer.output_ids), reasoning)
        turn = {k: v for k, v in history[j].items() if k not in ("thinking", "reasoning_content")}
        turn["content" if turn.get("content") is not None or turn.get("value") is None else "value"] = shaped.content
        if shaped.reasoning is not None:
            turn["reasoning_content"] = shaped.reasoning
        history[j] = turn
        result.finish_reasons.append(answer.finish_reason)
        result.generated_tokens += len(answer.output_ids)
        result.prompt_tokens += len(prompt)
        per_turn.append({"turn": j, "finish_reason": answer.finish_reason, "generated_tokens": len(answer.output_ids),
                         "prompt_tokens": len(prompt)})
    field_name = "conversations" if raw.get("conversations") is not None else "messages"
    result.row = {**raw, field_name: history, META_KEY: {**meta, "source_row": source_row, "turns": per_turn}}
    return result
