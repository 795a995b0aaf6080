# ruff: noqa: RUF001 - DeepSeek's special tokens are spelled with fullwidth bars (U+FF5C), as in its tokenizer
"""SpecForge 0.2.0's chat template registry (``specforge/data/template.py``) as data, and which entry a
model's own chat template fits.

SpecForge's ``GeneralParser`` uses three fields of an entry: the system prompt it inserts when the data
has none, the assistant header and the end-of-turn string (the supervised span is the text between
them, found by regex). The user header plays no part in it. ``tests/trainers/test_prepare_parity.py``
checks this table against the released registry, field by field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hsextract.errors import ConfigError

_LLAMA3_SYSTEM = (
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being safe.  "
    "Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal content. "
    "Please ensure that your responses are socially unbiased and positive in nature.\n\nIf a question does not make "
    "any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't "
    "know the answer to a question, please don't share false information."
)
_HELPFUL = "You are a helpful assistant."


@dataclass(frozen=True)
class RegistryTemplate:
    """One SpecForge registry entry that ``GeneralParser`` (or its ``ThinkingParser`` subclass) handles."""

    name: str
    assistant_header: str
    user_header: str
    end_of_turn: str
    system_prompt: str | None
    parser_type: str = "general"  # "thinking": ThinkingParser, reasoning_content / name / tool_call_id kept
    ignore_tokens: tuple[str, ...] = ()
    enable_thinking: bool = False  # a thinking parser passes enable_thinking=True to the template

    @property
    def render_kwargs(self) -> dict[str, bool]:
        """What SpecForge's parser passes to apply_chat_template beyond the messages."""
        if self.parser_type != "thinking":
            return {}
        return {"add_special_tokens": False, **({"enable_thinking": True} if self.enable_thinking else {})}

    def assistant_pattern(self) -> re.Pattern[str]:
        """GeneralParser's pattern: the assistant header, then the shortest text through the end of turn (or the end)."""
        return re.compile(re.escape(self.assistant_header) + r"([\s\S]*?(?:" + re.escape(self.end_of_turn) + "|$))", re.DOTALL)


def _t(name: str, assistant: str, user: str, eot: str, system: str | None, **kw: Any) -> RegistryTemplate:
    return RegistryTemplate(name, assistant, user, eot, system, **kw)


TEMPLATES: dict[str, RegistryTemplate] = {
    t.name: t
    for t in (
        _t("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|start_header_id|>user<|end_header_id|>",
           "<|eot_id|>", _LLAMA3_SYSTEM),
        _t("llama4", "<|header_start|>assistant<|header_end|>\n\n", "<|header_start|>user<|header_end|>", "<|eot|>",
           _HELPFUL),
        _t("qwen", "<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>\n", _HELPFUL),
        _t("lfm", "<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>\n", ""),
        _t("phi3", "<|assistant|>\n", "<|user|>\n", "<|end|>\n", _HELPFUL),
        _t("phi4", "<|im_start|>assistant<|im_sep|>", "<|im_start|>user<|im_sep|>", "<|im_end|>", _HELPFUL),
        _t("phi4-mini", "<|assistant|>", "<|user|>", "<|end|>", _HELPFUL),
        _t("gpt-oss-naive", "<|start|>assistant<|channel|>analysis<|message|>", "<|start|>user<|message|>", "<|end|>",
           None),
        _t("qwen3-thinking", "<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>\n", _HELPFUL,
           parser_type="thinking", enable_thinking=True),
        _t("qwen3-instruct", "<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>\n", _HELPFUL,
           ignore_tokens=("<think>\n\n</think>\n\n",)),
        _t("qwen3-next-thinking", "<|im_start|>assistant\n<think>\n", "<|im_start|>user\n", "<|im_end|>\n", _HELPFUL,
           parser_type="thinking", enable_thinking=True),
        _t("kimi-k2-thinking", "<|im_assistant|>assistant<|im_middle|>", "<|im_start|>user\n", "<|im_end|>", _HELPFUL,
           parser_type="thinking", enable_thinking=True),
        _t("kimi-k2-instruct", "<|im_assistant|>assistant<|im_middle|>", "<|im_start|>user\n", "<|im_end|>", _HELPFUL),
        _t("kimi-k3-thinking", '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>',
           '<|open|>message role="user"<|sep|>', "<|end_of_msg|>", None, parser_type="thinking",
           ignore_tokens=("<|end_of_msg|>",)),  # enable_thinking False: its renderer opens the think segment
        _t("deepseek-v3", "<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>", _HELPFUL),
        _t("deepseek-v2", "Assistant: ", "User: ", "<｜end▁of▁sentence｜>", None),
        _t("ling-flash-2.0", "<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>", _HELPFUL),
        _t("deepseek-v32", "<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>", "", parser_type="thinking",
           enable_thinking=True),
        _t("gemma", "<start_of_turn>model\n", "<start_of_turn>user\n", "<end_of_turn>\n", _HELPFUL),
        _t("longcat_xml", "<longcat_assistant>", "<longcat_user>", "</longcat_s>", _HELPFUL),
        _t("qwen3.5", "<|im_start|>assistant\n<think>\n", "<|im_start|>user\n", "<|im_end|>\n", "",
           parser_type="thinking", enable_thinking=True),
    )
}

#: registry entries prepare does not reproduce, and why
UNSUPPORTED: dict[str, str] = {
    "gpt-oss": "its openai-harmony parser builds the text itself, not through the chat template",
    "deepseek-r1-distill": "it has no end-of-turn string, so SpecForge 0.2.0's GeneralParser cannot build its pattern",
    "glm-5.2": "its GLM parser and pattern are not reproduced",
    "longcat": "its longcat assistant pattern is not reproduced",
    "inkling-thinking": "its inkling assistant pattern is not reproduced",
}

#: the probe conversation a model's template is matched with: distinct answers, a system prompt
_PROBE_ANSWERS = ("hsx probe answer one", "hsx probe answer two")
_PROBE = [
    {"role": "system", "content": "hsx probe system"},
    {"role": "user", "content": "hsx probe question one"},
    {"role": "assistant", "content": _PROBE_ANSWERS[0]},
    {"role": "user", "content": "hsx probe question two"},
    {"role": "assistant", "content": _PROBE_ANSWERS[1]},
]


def fits(template: RegistryTemplate, rendered: str) -> bool:
    """The entry's pattern finds exactly the probe's answers, each followed by its end-of-turn string."""
    found = [m.group(1) for m in template.assistant_pattern().finditer(rendered)]
    return found == [answer + template.end_of_turn for answer in _PROBE_ANSWERS]


def matching_templates(tokenizer: Any) -> list[str]:
    """The registry entries whose assistant header and end of turn frame the answers of the model's template."""
    names = []
    for template in TEMPLATES.values():
        try:
            rendered = tokenizer.apply_chat_template(
                _PROBE, tokenize=False, add_generation_prompt=False, **template.render_kwargs
            )
        except Exception:  # a template that cannot render the probe fits no entry
            continue
        if fits(template, rendered):
            names.append(template.name)
    return names


def resolve_template(
    name: str | None, tokenizer: Any, model: str, option: str = "--specforge-template"
) -> RegistryTemplate:
    """The entry named by ``--specforge-template``, else the only one the model's template fits. ``option`` is how the
    messages spell the setting: the flag, or the key of the file it was read from (``hsextract pipeline``'s)."""
    if name is not None:
        if name in UNSUPPORTED:
            raise ConfigError(f"{option} {name}: not supported by prepare, {UNSUPPORTED[name]}")
        if name not in TEMPLATES:
            raise ConfigError(
                f"{option} {name!r} is not a SpecForge 0.2.0 registry template prepare handles; "
                f"choose one of {', '.join(TEMPLATES)}"
            )
        return TEMPLATES[name]
    names = matching_templates(tokenizer)
    if len(names) == 1:
        return TEMPLATES[names[0]]
    if names:
        raise ConfigError(
            f"the chat template of {model} fits several SpecForge registry templates ({', '.join(names)}), which "
            f"differ in the system prompt inserted when a conversation has none; choose one with {option} "
            "NAME (the one you will give SpecForge's --chat-template)"
        )
    raise ConfigError(
        f"the chat template of {model} fits no SpecForge 0.2.0 registry template (none frames its assistant turns); "
        f"choose one with {option} NAME ({', '.join(TEMPLATES)}), or use --like speculators"
    )
