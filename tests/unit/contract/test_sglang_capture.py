"""The SGLang capture table: family detection and the draft value search (the table itself is
checked against SGLang's own methods in tests/sglang_contract/test_capture_table.py)."""

from __future__ import annotations

import pytest

from hsextract.contract.layers import capture_indices, default_aux_layer_ids
from hsextract.contract.sglang_capture import (
    ModelFamily,
    captured_states,
    draft_layer_ids,
    family_of,
    layers_to_capture,
    parse_family,
)
from hsextract.errors import ConfigError


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}, ModelFamily.DEEPSEEK),
        ({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k2"}, ModelFamily.DEEPSEEK),
        ({"model_type": "kimi_k2"}, ModelFamily.DEEPSEEK),
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, ModelFamily.LLAMA),
        ({"architectures": ["Qwen2ForCausalLM"]}, ModelFamily.QWEN2),
        ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe"}, None),
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, None),
        ({}, None),
    ],
)
def test_family_from_config_json(config: dict[str, object], family: ModelFamily | None) -> None:
    assert family_of(config) is family


def test_unknown_family_name_lists_the_choices() -> None:
    assert parse_family("llama") is ModelFamily.LLAMA
    with pytest.raises(ConfigError, match="choose one of deepseek, llama, qwen2"):
        parse_family("mistral")


@pytest.mark.parametrize("family", list(ModelFamily))
@pytest.mark.parametrize("num_layers", [7, 8, 61])
def test_the_default_needs_no_ids_and_is_served_with_its_own_layer_ids(family: ModelFamily, num_layers: int) -> None:
    default = default_aux_layer_ids(num_layers)
    assert layers_to_capture(family, None, num_layers) == capture_indices(default)
    # the value SpecForge writes by default ([1, N//2-1, N-4]) serves it for every family
    assert draft_layer_ids(family, default, num_layers) == default


def test_the_value_depends_on_the_family_for_an_explicit_choice() -> None:
    assert draft_layer_ids(ModelFamily.DEEPSEEK, [2, 30, 58], 61) == [3, 31, 59]
    assert draft_layer_ids(ModelFamily.LLAMA, [2, 30, 58], 61) == [2, 30, 58]
    assert draft_layer_ids(ModelFamily.QWEN2, [2, 30, 58], 61) == [2, 30, 58]


def test_inexpressible_layers_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"capture the outputs of layers \[0, 30, 58\] .*hidden_states\[1, 31, 59\]"):
        draft_layer_ids(ModelFamily.DEEPSEEK, [0, 30, 58], 61)
    assert draft_layer_ids(ModelFamily.LLAMA, [0, 30, 58], 61) == [0, 30, 58]


def test_captured_states_are_in_layer_order_once() -> None:
    assert captured_states([31, 3, 59, 3]) == [3, 31, 59]
