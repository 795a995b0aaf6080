"""The model's tokenizer and chat template, loaded once and checked before any row is read."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError

log = logging.getLogger(__name__)

_PROBE = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


@dataclass(frozen=True)
class ModelTokenizer:
    tokenizer: Any
    chat_template: str
    template_sha256: str
    template_source: str  # the model directory, or the --chat-template file
    fingerprint: str  # sha256 over the vocabulary, merges, added and special tokens
    vocab_size: int


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of what decides the ids: a fast tokenizer's serialized model, else its vocabulary; plus special tokens."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def load_tokenizer(model: Path, trust_remote_code: bool) -> Any:
    """The tokenizer of the model directory ``model``, or ConfigError naming the fix."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from transformers import AutoTokenizer

    if not Path(model).is_dir():
        raise ConfigError(f"--model {model} is not a directory; give the model directory (its tokenizer and chat template)")
    try:
        return AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types for a directory it cannot read
        remote = "" if trust_remote_code else " or --trust-remote-code when the model ships its own tokenizer code (Kimi)"
        raise ConfigError(
            f"cannot load the tokenizer of --model {model}: {type(exc).__name__}: {exc}; give a model directory with "
            f"tokenizer files (tokenizer.json, tokenizer_config.json){remote}"
        ) from None


def load_model_tokenizer(model: Path, chat_template: Path | None, trust_remote_code: bool) -> ModelTokenizer:
    """The tokenizer of ``model`` with its chat template (``chat_template`` replaces it), or ConfigError naming the fix."""
    tokenizer = load_tokenizer(model, trust_remote_code)
    source = str(model)
    if chat_template is not None:
        try:
            tokenizer.chat_template = Path(chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--chat-template {chat_template} cannot be read: {exc.strerror}; give a Jinja file") from None
        source = str(chat_template)
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ConfigError(
            f"the tokenizer of {model} has no chat template (no chat_template in tokenizer_config.json or "
            "chat_template.jinja); give one with --chat-template FILE"
        )
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=False)
    except Exception as exc:  # jinja2 and the template itself raise many types
        raise ConfigError(
            f"the chat template from {source} cannot render a user/assistant exchange: {type(exc).__name__}: {exc}; "
            "fix the template or give another with --chat-template FILE"
        ) from None
    if "hi" not in text:
        raise ConfigError(f"the chat template from {source} does not render the assistant's content; give another with "
                          "--chat-template FILE")
    return ModelTokenizer(
        tokenizer=tokenizer,
        chat_template=template,
        template_sha256=hashlib.sha256(template.encode()).hexdigest(),
        template_source=source,
        fingerprint=tokenizer_fingerprint(tokenizer),
        vocab_size=len(tokenizer),
    )
