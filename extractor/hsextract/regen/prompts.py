"""Prompts and answers: the history rendered as ``prepare`` renders it, the answer's ids decoded locally.

The prompt of an assistant turn is the chat template's render of the conversation before it with the
generation prompt (``apply_chat_template(..., add_generation_prompt=True)`` through prepare's
:func:`~hsextract.prepare.rows.render`, on prepare's normalized messages), encoded without added special
tokens (the template wrote them): the ids ``prepare`` will see for that history. The server gets those
ids; it never sees text, so a server started with ``--skip-tokenizer-init`` serves it.

Generation stops at the model's end of turn: the tokenizer's EOS, the ids of ``generation_config.json``'s
``eos_token_id``, and the special token(s) the template writes right after an assistant's content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.prepare.model_tokenizer import ModelTokenizer
from hsextract.prepare.rows import encode_texts, render
from hsextract.prepare.speculators import speculators_messages

_PROBE_ANSWER = "hi there"
_PROBE = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": _PROBE_ANSWER}]
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _generation_config_eos(model_dir: Path | None) -> list[int]:
    if model_dir is None:
        return []
    try:
        data = json.loads((Path(model_dir) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    value = data.get("eos_token_id") if isinstance(data, dict) else None
    values = value if isinstance(value, list) else [value]
    return [int(v) for v in values if isinstance(v, int)]


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The special tokens the chat template writes right after an assistant's content (``<|im_end|>``,
    ``<|eot_id|>``, DeepSeek's end of sentence): the first run of special tokens after it."""
    text = render(tokenizer, _PROBE, False, None)
    suffix = text[text.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {int(i) for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(token, "special", False)}
    found: list[int] = []
    for token_id in encode_texts(tokenizer, [suffix])[0] if suffix else []:
        if token_id in special:
            found.append(token_id)
        elif found:
            break
    return found


def stop_token_ids(model: ModelTokenizer, model_dir: Path | None) -> list[int]:
    """Every id that ends an answer: EOS, generation_config's EOS ids, the template's end of turn."""
    ids: set[int] = set(_generation_config_eos(model_dir))
    eos = getattr(model.tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    ids.update(end_of_turn_ids(model.tokenizer))
    return sorted(ids)


class Prompter:
    """Renders histories to prompt ids and decodes answers, with one tokenizer and its template."""

    def __init__(self, model: ModelTokenizer, stop_ids: list[int], template_kwargs: dict[str, Any]) -> None:
        self.model = model
        self.stop_ids = stop_ids
        self._stop = frozenset(stop_ids)
        self.template_kwargs = template_kwargs

    def prompt_ids(self, history: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        """The ids of ``history`` (prepare's normalized messages) with the generation prompt."""
        text = render(self.model.tokenizer, speculators_messages(history), True, tools, **self.template_kwargs)
        return encode_texts(self.model.tokenizer, [text])[0]

    def decode(self, output_ids: list[int]) -> str:
        """The answer's text: trailing end-of-turn ids cut, special tokens skipped."""
        ids = list(output_ids)
        while ids and ids[-1] in self._stop:
            ids.pop()
        return str(self.model.tokenizer.decode(ids, skip_special_tokens=True))


@dataclass(frozen=True)
class Answer:
    content: str
    reasoning: str | None  # only with --reasoning split, when the answer had a thinking block


_LEADING_OPEN = re.compile(r"^\s*" + re.escape(THINK_OPEN))


def shape_answer(text: str, mode: str) -> Answer:
    """``text`` as ``--reasoning`` wants it: keep it whole, drop the thinking block, or split it off.

    A thinking block is the text through ``</think>`` (with or without its ``<think>``: some templates put
    ``<think>`` in the generation prompt); an answer cut inside an unclosed ``<think>`` is all thinking."""
    if mode == "keep":
        return Answer(text, None)
    if THINK_CLOSE in text:
        thinking, _, content = text.partition(THINK_CLOSE)
        thinking = _LEADING_OPEN.sub("", thinking, count=1)
    elif _LEADING_OPEN.match(text):
        thinking, content = _LEADING_OPEN.sub("", text, count=1), ""
    else:
        return Answer(text, None)
    content = content.lstrip()
    return Answer(content, thinking.strip() if mode == "split" else None)
