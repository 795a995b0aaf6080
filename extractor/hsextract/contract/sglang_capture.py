"""Which states SGLang serves a drafter on: ``eagle_aux_hidden_state_layer_ids`` -> ``layers_to_capture``.

A drafter's ``config.json`` ``eagle_config.eagle_aux_hidden_state_layer_ids`` (and the launcher's
``--return-aux-hidden-state-layer-ids``) reach the *target* model's ``set_eagle3_layers_to_capture``,
which sets ``layers_to_capture``: capture index ``i`` is the residual stream entering decoder layer
``i`` (transformers ``hidden_states[i]``, our layer id ``i - 1``), concatenated in layer order. The
arithmetic differs by model family in SGLang 0.5.23:

* llama, qwen2: ``layers_to_capture = [id + 1 for id in ids]``
* deepseek (DeepSeek-V2/V3, Kimi-K2/K2.5): ``[id + 1 ...]`` when the first id is 1, else the ids as given
* every family, no ids configured: ``[2, N//2, N-3]``

So the value a drafter must carry to be served on the states we extracted depends on the family and
on the ids. The extractor has no SGLang installed: this module restates 0.5.23's rules, and
``tests/sglang_contract/test_capture_table.py`` checks them against SGLang's own methods for every
family over many id sets. The launcher, which runs beside SGLang, uses the real method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from hsextract.contract.layers import capture_indices
from hsextract.errors import ConfigError

#: the SGLang version whose rules this module restates (the pinned one)
SGLANG_VERSION = "0.5.23"


class ModelFamily(str, Enum):
    """How SGLang numbers a drafter's aux layer ids for a target model."""

    DEEPSEEK = "deepseek"
    LLAMA = "llama"
    QWEN2 = "qwen2"

    def __str__(self) -> str:
        return str(self.value)


#: (module, class) in SGLang whose ``set_eagle3_layers_to_capture`` serves each family
SGLANG_MODEL_CLASSES: dict[ModelFamily, tuple[str, str]] = {
    ModelFamily.DEEPSEEK: ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM"),
    ModelFamily.LLAMA: ("sglang.srt.models.llama", "LlamaForCausalLM"),
    ModelFamily.QWEN2: ("sglang.srt.models.qwen2", "Qwen2ForCausalLM"),
}

#: config.json ``architectures`` entries per family (SGLang serves each with the class above,
#: or, for Kimi-K2.5, delegates to it)
_ARCHITECTURES: dict[str, ModelFamily] = {
    "DeepseekV2ForCausalLM": ModelFamily.DEEPSEEK,
    "DeepseekV3ForCausalLM": ModelFamily.DEEPSEEK,
    "KimiK25ForConditionalGeneration": ModelFamily.DEEPSEEK,
    "LlamaForCausalLM": ModelFamily.LLAMA,
    "Qwen2ForCausalLM": ModelFamily.QWEN2,
}
#: config.json ``model_type`` per family, when ``architectures`` does not tell
_MODEL_TYPES: dict[str, ModelFamily] = {
    "deepseek_v2": ModelFamily.DEEPSEEK,
    "deepseek_v3": ModelFamily.DEEPSEEK,
    "kimi_k2": ModelFamily.DEEPSEEK,
    "kimi_k25": ModelFamily.DEEPSEEK,
    "llama": ModelFamily.LLAMA,
    "qwen2": ModelFamily.QWEN2,
}

CaptureRule = Callable[[ModelFamily, "Sequence[int] | None", int], list[int]]


def family_of(model_config: dict[str, Any]) -> ModelFamily | None:
    """The family of a model from its ``config.json`` (as :func:`read_model_config` gives it), or None."""
    for name in model_config.get("architectures") or []:
        if str(name) in _ARCHITECTURES:
            return _ARCHITECTURES[str(name)]
    return _MODEL_TYPES.get(str(model_config.get("model_type", "")))


def parse_family(name: str) -> ModelFamily:
    try:
        return ModelFamily(name)
    except ValueError:
        choices = ", ".join(f.value for f in ModelFamily)
        raise ConfigError(f"unknown model family {name!r}; choose one of {choices}") from None


def layers_to_capture(family: ModelFamily, layer_ids: Sequence[int] | None, num_layers: int) -> list[int]:
    """``layers_to_capture`` SGLang 0.5.23 sets for a drafter's ``eagle_aux_hidden_state_layer_ids``."""
    if layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]
    ids = [int(i) for i in layer_ids]
    if family is ModelFamily.DEEPSEEK and not (ids and ids[0] == 1):
        return ids
    return [i + 1 for i in ids]


def captured_states(capture: Sequence[int]) -> list[int]:
    """The capture indices whose states SGLang hands the drafter, in the order it concatenates them.

    The model's layer loop appends a state when ``i in layers_to_capture``: layer order, each once."""
    return sorted(set(capture))


def draft_layer_ids(
    family: ModelFamily, aux_layer_ids: Sequence[int], num_layers: int, rule: CaptureRule = layers_to_capture
) -> list[int]:
    """The ``eagle_aux_hidden_state_layer_ids`` that makes SGLang capture exactly the outputs of
    ``aux_layer_ids`` (capture indices ``aux + 1``) for this family.

    Tries the layer ids themselves first (the value SpecForge writes and llama/qwen2 need), then the
    capture indices (what DeepSeek needs unless the first layer id is 1). ``rule`` computes the
    capture: this module's table, or the installed SGLang's own method (the launcher).
    Raises ConfigError when no value does."""
    wanted = capture_indices(aux_layer_ids)
    for candidate in (list(aux_layer_ids), wanted):
        if rule(family, candidate, num_layers) == wanted:
            return candidate
    raise ConfigError(
        f"no eagle_aux_hidden_state_layer_ids value makes SGLang {SGLANG_VERSION} ({family}) capture the outputs of "
        f"layers {list(aux_layer_ids)} (transformers hidden_states{wanted}): a drafter trained on them could not be "
        "served by SGLang. Choose other layer_ids (for DeepSeek-family models a first layer id of 0 collides with "
        "SGLang's 'first id is 1 -> add one' rule)"
    )
