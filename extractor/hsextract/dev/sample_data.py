"""Generate a sample tokenized dataset: JSONL rows with ``input_ids`` and ``loss_mask``."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from hsextract.durable.atomic import temp_path


def make_sample_data(path: Path, num: int = 64, vocab_size: int = 4096, seed: int = 0, max_len: int = 6000) -> Path:
    """Conversations with a realistic long-tailed length spread (log-normal, median ~600 tokens),
    a few longer than the default ``--max-seq-len`` 4096. The loss mask is 0 on the "user" turns
    and 1 on the "assistant" turns, as a chat template's mask would be."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with open(tmp, "w") as handle:
        for index in range(num):
            if index % 16 == 5:
                length = rng.randint(min(4200, max_len), max_len)  # some rows exceed the default max_seq_len
            else:
                length = min(max_len, max(8, int(rng.lognormvariate(6.2, 0.9))))
            ids = [rng.randrange(vocab_size) for _ in range(length)]
            mask: list[int] = []
            turn_user = True
            while len(mask) < length:
                turn = min(length - len(mask), rng.randint(16, 400))
                mask.extend([0 if turn_user else 1] * turn)
                turn_user = not turn_user
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    os.replace(tmp, path)
    return path


_WORD_TEXT = (
    "the a model answer question data token layer state draft verify train step list short long because then "
    "Straße café naïve déjà über привет мир данные 你好 世界 模型 こんにちは データ 안녕하세요 مرحبا 🙂 🚀 ∑ π →"
)
_WORDS = tuple(_WORD_TEXT.split())
_SYSTEM_PROMPTS = ("You are a terse assistant.", "Réponds en français, s'il te plaît.", "你是一个有用的助手。")
#: the input layouts of make_sample_conversations
CONVERSATION_STYLES = ("sharegpt", "messages")


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high))).capitalize() + rng.choice(".?!")


def sample_conversation(rng: random.Random, max_turns: int = 4, max_words: int = 60) -> list[dict[str, str]]:
    """One conversation as role/content messages: 1 to ``max_turns`` exchanges, a system prompt in one of three."""
    messages = []
    if rng.random() < 0.35:
        messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
    for _ in range(rng.randint(1, max_turns)):
        messages.append({"role": "user", "content": _sentence(rng, 2, max_words // 3)})
        answer = " ".join(_sentence(rng, 3, max_words // 2) for _ in range(rng.randint(1, 3)))
        messages.append({"role": "assistant", "content": answer})
    return messages


def make_sample_conversations(path: Path, num: int = 64, seed: int = 0, style: str = "sharegpt") -> Path:
    """A JSONL file of multi-turn conversations (unicode, some with a system prompt) for ``hsextract prepare``:
    ShareGPT rows (``conversations`` of ``from``/``value``) or OpenAI rows (``messages`` of ``role``/``content``)."""
    if style not in CONVERSATION_STYLES:
        raise ValueError(f"unknown conversation style {style!r}; choose one of {', '.join(CONVERSATION_STYLES)}")
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    sharegpt_role = {"system": "system", "user": "human", "assistant": "gpt"}
    with open(tmp, "w", encoding="utf-8") as handle:
        for index in range(num):
            messages = sample_conversation(rng)
            if style == "sharegpt":
                turns = [{"from": sharegpt_role[m["role"]], "value": m["content"]} for m in messages]
                row: dict[str, object] = {"id": f"sample-{index}", "conversations": turns}
            else:
                row = {"id": f"sample-{index}", "messages": messages}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
