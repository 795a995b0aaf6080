"""``--like specforge``: SpecForge 0.2.0's rows (``specforge/data/parse.py`` ``GeneralParser``, as
``specforge/data/preprocessing.py`` ``preprocess_conversations`` runs it).

One row per conversation, every assistant turn supervised:

1. turns normalized (``role``, else ``from``; ``content``, else ``value``; human/gpt to user/assistant);
   the data's leading system turn kept, else the registry template's system prompt inserted (when not
   empty); turns before the first user turn dropped; the conversation cut at an assistant turn that does
   not follow a user or tool turn, or a tool turn that does not follow an assistant or tool turn;
   each turn keeps only ``role``, ``content``, ``tool_calls`` (a thinking template: also
   ``reasoning_content``, ``name``, ``tool_call_id``), tool calls parsed from JSON text;
2. rendered whole by the chat template (no generation prompt), encoded without added special tokens
   and cut to ``max_seq_len`` tokens;
3. the supervised spans: the template's assistant header, then the shortest text through its end of
   turn string (or the end of the text); each span's token positions are the lengths of the encoded
   text before its start and through its end; the template's ignore tokens are unmasked the same way.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hsextract.prepare.conversation import BadRow, Conversation, Reason
from hsextract.prepare.registry import RegistryTemplate
from hsextract.prepare.rows import ALL_TURNS, Outcome, OutRow, encode_texts, render

_GENERAL_KEYS = frozenset({"role", "content", "tool_calls"})
_THINKING_KEYS = _GENERAL_KEYS | {"reasoning_content", "name", "tool_call_id"}
#: a count in notes: conversations cut at an out-of-order turn (the rest of that conversation is not used)
CUT = "conversation cut at an out-of-order turn"


def _normalize(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role", message.get("from", ""))
    content = message.get("content") or message.get("value") or ""
    role = {"human": "user", "gpt": "assistant"}.get(role, role)
    normalized = {**message, "role": role, "content": content}
    normalized.pop("from", None)
    normalized.pop("value", None)
    return normalized


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    clean: dict[str, Any] = {"id": call.get("id", ""), "type": call.get("type", "function")}
    function = call.get("function", {})
    if isinstance(function, dict):
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = {}
        clean["function"] = {"name": function.get("name", ""), "arguments": arguments}
    return clean


def _sanitize(message: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    cleaned = {k: v for k, v in message.items() if k in keys}
    if "tool_calls" in cleaned:
        calls = cleaned["tool_calls"]
        if isinstance(calls, str):
            try:
                calls = json.loads(calls)
            except json.JSONDecodeError:
                cleaned.pop("tool_calls")
                return cleaned
        if isinstance(calls, list):
            cleaned["tool_calls"] = [_tool_call(c) for c in calls if isinstance(c, dict)]
    return cleaned


def specforge_messages(turns: list[dict[str, Any]], template: RegistryTemplate) -> tuple[list[dict[str, Any]], bool]:
    """The messages GeneralParser renders, and whether the conversation was cut at an out-of-order turn."""
    conversation = [_normalize(turn) for turn in turns]
    messages: list[dict[str, Any]] = []
    if conversation[0]["role"] == "system":
        messages.append({"role": "system", "content": conversation[0]["content"]})
        conversation = conversation[1:]
    elif template.system_prompt:
        messages.append({"role": "system", "content": template.system_prompt})
    while conversation and conversation[0]["role"] != "user":
        conversation = conversation[1:]
    keys = _THINKING_KEYS if template.parser_type == "thinking" else _GENERAL_KEYS
    for j, message in enumerate(conversation):
        if j > 0:
            role, previous = message["role"], conversation[j - 1]["role"]
            if (role == "tool" and previous not in ("assistant", "tool")) or (
                role == "assistant" and previous not in ("user", "tool")
            ):
                return messages, True
        messages.append(_sanitize(message, keys))
    return messages, False


class SpecForgeConvention:
    name = "specforge"

    def __init__(self, tokenizer: Any, template: RegistryTemplate, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.max_seq_len = max_seq_len
        self._pattern = template.assistant_pattern()
        self._render_kwargs: dict[str, Any] = template.render_kwargs

    def _text(self, conversation: Conversation, notes: Counter[str]) -> str:
        messages, cut = specforge_messages(conversation.turns, self.template)
        if cut:
            notes[CUT] += 1
        try:
            return render(self.tokenizer, messages, False, conversation.tools, **self._render_kwargs)
        except Exception as exc:  # a template raises what it likes; the row is recorded, the run goes on
            raise BadRow(Reason.TEMPLATE_FAILED, f"row {conversation.source_row}: the chat template raised "
                         f"{type(exc).__name__}: {exc}") from None

    def _spans(self, text: str) -> list[tuple[int, int, int]]:
        """(start char, end char, value) of every span to mark, in GeneralParser's order."""
        spans = [(m.start(1), m.end(1), 1) for m in self._pattern.finditer(text)]
        for token in self.template.ignore_tokens:
            start = 0
            while (index := text.find(token, start)) != -1:
                spans.append((index, index + len(token), 0))
                start = index + len(token)
        return spans

    def prepare(self, conversations: list[Conversation]) -> list[Outcome]:
        outcomes = [Outcome(c.source_row) for c in conversations]
        texts: dict[int, str] = {}
        for index, (conversation, outcome) in enumerate(zip(conversations, outcomes, strict=True)):
            try:
                texts[index] = self._text(conversation, outcome.notes)
            except BadRow as exc:
                outcome.error = exc
        spans = {index: self._spans(text) for index, text in texts.items()}
        # One batched encode: every whole text, then every span boundary's prefix.
        order = list(texts)
        wanted = [texts[i] for i in order] + [texts[i][:end] for i in order for s, e, _ in spans[i] for end in (s, e)]
        encoded = encode_texts(self.tokenizer, wanted)
        lengths = iter(len(ids) for ids in encoded[len(order):])
        limit = self.max_seq_len
        for position, index in enumerate(order):
            full = encoded[position]
            input_ids = full[:limit]
            mask = [0] * len(input_ids)
            for _, _, value in spans[index]:
                start = min(next(lengths), limit, len(input_ids))
                end = min(next(lengths), limit, len(input_ids))
                if start < end:
                    mask[start:end] = [value] * (end - start)
            outcome = outcomes[index]
            if not any(mask):
                outcome.error = BadRow(Reason.NO_SUPERVISED_TOKEN, f"row {outcome.source_row}: no assistant token within "
                                       f"the first {limit} tokens (no assistant turn, or all cut by --max-seq-len)")
                outcome.notes[Reason.NO_SUPERVISED_TOKEN] += 1
                continue
            outcome.rows.append(OutRow(input_ids, mask, ALL_TURNS, len(full) > limit))
        return outcomes
