"""``--like speculators``: speculators 0.9.0's rows (``speculators/data_generation/preprocessing.py``
``_normalize_conversation`` and ``_render_boundary_rows``), rendered here with the tokenizer's own
``apply_chat_template`` where speculators asks vLLM's ``/v1/chat/completions/render`` (which applies the
same template and encodes without added special tokens).

One row per assistant turn ``j`` (not the first turn of the conversation):

1. turns normalized (``from``, else ``role``; ``value``, else ``content``; human/gpt to user/assistant;
   ``tool_calls`` and ``tool_call_id`` kept when set; ``thinking`` / ``reasoning_content`` given to the
   template as both); no system prompt is inserted: the template's own default, if any, applies;
2. ``conv[:j]`` rendered with the generation prompt (the context), ``conv[:j+1]`` without (the row),
   both cut to ``max_seq_len`` tokens; a turn whose context alone fills ``max_seq_len`` gives no row
   (a later turn may still fit);
3. the mask is 0 over the context's tokens and 1 after them; when the row does not start with the
   context (a generation prompt that differs from the recorded turn), the boundary is their common
   prefix, valid only when the row starts with ``conv[:j]`` rendered without the generation prompt
   and the boundary is not inside it: otherwise the template is not prefix-stable and the whole
   conversation gives no row (speculators' ``BoundaryUnstableError``);
4. rows with no supervised token left are dropped.
"""

from __future__ import annotations

from typing import Any

from hsextract.prepare.conversation import BadRow, Conversation, Reason
from hsextract.prepare.rows import Outcome, OutRow, encode_texts, render

#: a count in notes: assistant turns whose context alone fills max_seq_len (no row for them)
CONTEXT_FILLS = "turn context fills max_seq_len"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


def speculators_messages(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The normalized conversation speculators renders (an unknown role is refused before this)."""
    normalized = []
    for turn in turns:
        role = turn.get("from", turn.get("role", ""))
        message: dict[str, Any] = {"role": _ROLES[role], "content": turn.get("value") or turn.get("content") or ""}
        if turn.get("tool_calls"):
            message["tool_calls"] = turn["tool_calls"]
        if turn.get("tool_call_id"):
            message["tool_call_id"] = turn["tool_call_id"]
        thinking = turn.get("thinking") or turn.get("reasoning_content")
        if thinking:
            message["thinking"] = thinking
            message["reasoning_content"] = thinking
        normalized.append(message)
    return normalized


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class SpeculatorsConvention:
    name = "speculators"

    def __init__(self, tokenizer: Any, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    def _texts(self, conversation: Conversation, messages: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
        """(turn, context text, row text) of every assistant turn after the first turn."""
        out = []
        try:
            for j, message in enumerate(messages):
                if message["role"] == "assistant" and j > 0:
                    context = render(self.tokenizer, messages[:j], True, conversation.tools)
                    out.append((j, context, render(self.tokenizer, messages[: j + 1], False, conversation.tools)))
        except Exception as exc:  # a template raises what it likes; the row is recorded, the run goes on
            raise BadRow(Reason.TEMPLATE_FAILED, f"row {conversation.source_row}: the chat template raised "
                         f"{type(exc).__name__}: {exc}") from None
        return out

    def _history_ids(self, conversation: Conversation, messages: list[dict[str, Any]], j: int) -> list[int]:
        text = render(self.tokenizer, messages[:j], False, conversation.tools)
        return encode_texts(self.tokenizer, [text])[0][: self.max_seq_len]

    def prepare(self, conversations: list[Conversation]) -> list[Outcome]:
        outcomes = [Outcome(c.source_row) for c in conversations]
        messages = [speculators_messages(c.turns) for c in conversations]
        turns: dict[int, list[tuple[int, str, str]]] = {}
        for index, conversation in enumerate(conversations):
            try:
                turns[index] = self._texts(conversation, messages[index])
            except BadRow as exc:
                outcomes[index].error = exc
        order = [(index, j) for index, items in turns.items() for j, _, _ in items]
        encoded = iter(encode_texts(self.tokenizer, [t for items in turns.values() for _, c, r in items for t in (c, r)]))
        limit = self.max_seq_len
        rows: dict[int, list[OutRow]] = {index: [] for index in turns}
        for index, j in order:
            context_ids, full = next(encoded)[:limit], next(encoded)
            outcome = outcomes[index]
            if outcome.error is not None:  # an unstable turn drops the whole conversation
                continue
            if len(context_ids) >= limit:
                outcome.notes[CONTEXT_FILLS] += 1
                continue
            row_ids = full[:limit]
            if row_ids[: len(context_ids)] == context_ids:
                boundary = len(context_ids)
            else:
                boundary = _common_prefix_len(context_ids, row_ids)
                history = self._history_ids(conversations[index], messages[index], j)
                if row_ids[: len(history)] != history or boundary < len(history):
                    outcome.error = BadRow(
                        Reason.NOT_PREFIX_STABLE,
                        f"row {outcome.source_row}: the chat template renders the history before assistant turn {j} "
                        "differently with and without that turn (not prefix-stable); speculators drops the conversation",
                    )
                    continue
            mask = [0] * boundary + [1] * (len(row_ids) - boundary)
            if not any(mask):
                outcome.notes[Reason.NO_SUPERVISED_TOKEN] += 1
                continue
            rows[index].append(OutRow(row_ids, mask, j, len(full) > limit))
        for index, items in rows.items():
            outcome = outcomes[index]
            if outcome.error is not None:
                continue
            outcome.rows = items
            if not items:
                outcome.error = BadRow(
                    Reason.NO_SUPERVISED_TOKEN,
                    f"row {outcome.source_row}: no assistant turn after the first turn gave a supervised token "
                    f"within --max-seq-len {limit}",
                )
        return outcomes
