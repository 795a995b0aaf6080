# ruff: noqa: RUF001 - DeepSeek's special tokens are spelled with fullwidth bars (U+FF5C), as in its tokenizer
"""A real tokenizer for the tiny models: a byte-level BPE trained here, a family's special tokens
and a chat template of that family's shape (``chat_templates/*.jinja``).

Nothing is downloaded: the BPE is trained in well under a second with the ``tokenizers`` library on
generated text (words in several scripts, so unicode round-trips through merges, not only bytes).
Its vocabulary is padded with reserved special tokens to exactly the model's ``vocab_size``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hsextract.errors import ConfigError

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).with_name("chat_templates")
#: the fewest tokens a byte-level BPE holds: the 256 bytes and the special tokens
MIN_VOCAB = 320


@dataclass(frozen=True)
class ChatFamily:
    """A chat template family: its Jinja file, special tokens and which of them are BOS / EOS / PAD."""

    name: str
    template_file: str
    special_tokens: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str

    def chat_template(self) -> str:
        return (TEMPLATE_DIR / self.template_file).read_text(encoding="utf-8")


FAMILIES: dict[str, ChatFamily] = {
    family.name: family
    for family in (
        ChatFamily(
            "chatml", "chatml.jinja", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>"
        ),
        ChatFamily(
            "llama3",
            "llama3.jinja",
            ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
            "<|begin_of_text|>",
            "<|eot_id|>",
            "<|end_of_text|>",
        ),
        ChatFamily(
            "deepseek_v3",
            "deepseek_v3.jinja",
            (
                "<｜begin▁of▁sentence｜>",
                "<｜end▁of▁sentence｜>",
                "<｜User｜>",
                "<｜Assistant｜>",
                "<｜tool▁outputs▁begin｜>",
                "<｜tool▁outputs▁end｜>",
                "<｜tool▁output▁begin｜>",
                "<｜tool▁output▁end｜>",
            ),
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        ChatFamily(
            "kimi_k2",
            "kimi_k2.jinja",
            ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"),
            "[BOS]",
            "<|im_end|>",
            "[EOS]",
        ),
    )
}
#: the family a tiny model of each architecture gets unless told otherwise
DEFAULT_FAMILY = {"qwen2": "chatml", "llama": "llama3", "deepseek_v3": "kimi_k2"}

_WORD_TEXT = (
    "the model answers every question with care and a short list of steps before it stops "
    "data token layer hidden state draft verify extract train prepare server request batch "
    "Straße café naïve déjà élève über Größe façade señor año niño "
    "привет мир данные модель слово ответ "
    "你好 世界 模型 数据 训练 问题 回答 "
    "こんにちは 世界 データ モデル "
    "안녕하세요 모델 데이터 "
    "مرحبا نموذج بيانات "
    "🙂 🚀 ✓ ∑ π ≈ → ★"
)
_WORDS = tuple(_WORD_TEXT.split())


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99999)))
        out.append(" ".join(words) + rng.choice([".", "?", "!", "", "\n"]))
    return out


def write_tokenizer(directory: Path, family: str, vocab_size: int, seed: int = 0, corpus: Iterable[str] | None = None) -> Path:
    """Train and save (``save_pretrained``) a tokenizer of exactly ``vocab_size`` tokens into ``directory``:
    on ``corpus`` (lines of text) when given, else on generated words of several scripts."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ConfigError(f"unknown chat template family {family!r}; choose one of {', '.join(FAMILIES)}")
    if vocab_size < MIN_VOCAB:
        raise ConfigError(f"--vocab-size {vocab_size} is too small for a byte-level BPE tokenizer; use {MIN_VOCAB} or more")
    spec = FAMILIES[family]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed) if corpus is None else corpus, trainer=trainer)
    missing = vocab_size - bpe.get_vocab_size()
    if missing > 0:  # the corpus ran out of merges: reserved tokens fill the rest, as real vocabularies do
        bpe.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in range(missing)])
    if bpe.get_vocab_size() != vocab_size:
        raise AssertionError(f"tokenizer has {bpe.get_vocab_size()} tokens, not {vocab_size}")
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        chat_template=spec.chat_template(),
        clean_up_tokenization_spaces=False,
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    log.info("wrote a %s tokenizer (%d tokens, %s chat template) to %s", family, vocab_size, family, directory)
    return directory
