"""Generate small random-weight models that ``transformers`` loads (the embedded default)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from hsextract.contract.layers import default_aux_layer_ids
from hsextract.errors import ConfigError

log = logging.getLogger(__name__)

ARCHITECTURES = ("deepseek_v3", "llama", "qwen2")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def min_layers() -> int:
    """The fewest layers whose default aux layers are three distinct layers below the last."""
    for num_layers in range(1, 64):
        try:
            default_aux_layer_ids(num_layers)
        except ConfigError:
            continue
        return num_layers
    raise AssertionError("no layer count up to 63 has default aux layers")


def _config(arch: str, layers: int, hidden: int, vocab_size: int) -> object:
    import transformers

    heads = max(2, hidden // 32)
    # A larger initializer than the default 0.02 makes every layer move the residual stream
    # visibly, so an off-by-one layer index is far from the right one in the reference check.
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=32768,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    if arch == "deepseek_v3":
        return transformers.DeepseekV3Config(
            **common,
            intermediate_size=hidden * 2,
            moe_intermediate_size=hidden // 2,
            num_key_value_heads=heads,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            q_lora_rank=hidden // 2,
            kv_lora_rank=hidden // 4,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=hidden // heads,
        )
    if arch == "llama":
        return transformers.LlamaConfig(**common, intermediate_size=hidden * 2, num_key_value_heads=max(1, heads // 2))
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, intermediate_size=hidden * 2, num_key_value_heads=max(1, heads // 2))
    raise ConfigError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")


def make_tiny_model(
    directory: Path,
    arch: str = "deepseek_v3",
    layers: int = 8,
    hidden: int = 128,
    vocab_size: int = 4096,
    seed: int = 0,
    dtype: str = "bfloat16",
    chat_family: str | None = None,
) -> Path:
    """Write a ``save_pretrained`` directory with random weights and a tokenizer of the same vocabulary
    (``chat_family``'s special tokens and chat template; default: the architecture's family); returns its path."""
    import transformers

    from hsextract.dev.tokenizer import DEFAULT_FAMILY, write_tokenizer

    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    try:
        default_aux_layer_ids(layers)  # serve uses the default layers: refuse a model it would refuse
    except ConfigError as exc:
        raise ConfigError(f"--layers {layers} is too few: {exc}; choose --layers {min_layers()} or more") from None
    if hidden < 32 or hidden % 32:
        raise ConfigError(f"--hidden {hidden} must be a positive multiple of 32")
    config = _config(arch, layers, hidden, vocab_size)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model = model.to(DTYPES[dtype]).eval()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.dtype = dtype  # recorded as the model's serving dtype
    model.save_pretrained(str(directory))
    write_tokenizer(directory, chat_family or DEFAULT_FAMILY.get(arch, "chatml"), vocab_size, seed)
    log.info("wrote a %s model (%d layers, hidden %d, %s) to %s", arch, layers, hidden, dtype, directory)
    return directory
