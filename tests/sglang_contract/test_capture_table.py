"""The extractor's table of SGLang's aux-layer arithmetic against SGLang's own methods.

The extractor has no SGLang: it computes a drafter's ``eagle_aux_hidden_state_layer_ids`` from
``hsextract.contract.sglang_capture``. Here that table meets the installed SGLang's real
``set_eagle3_layers_to_capture`` of every family, over every id triple of small models and many of
large ones, with no ids, and through Kimi-K2.5's delegating wrapper.
"""

from __future__ import annotations

import importlib
import itertools
import random
import types
from collections.abc import Sequence

import pytest
import sglang
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

from hsextract.capture.sglang.launcher import _sglang_method, layer_id_argument, sglang_capture
from hsextract.contract.layers import capture_indices, default_aux_layer_ids
from hsextract.contract.sglang_capture import (
    SGLANG_MODEL_CLASSES,
    SGLANG_VERSION,
    ModelFamily,
    draft_layer_ids,
    layers_to_capture,
)
from hsextract.errors import ConfigError

FAMILIES = list(ModelFamily)


def real_capture(family: ModelFamily, ids: Sequence[int] | None, num_layers: int) -> list[int]:
    """SGLang's own method on a stand-in with the attributes it reads (no weights, no GPU)."""
    module, name = SGLANG_MODEL_CLASSES[family]
    method = getattr(importlib.import_module(module), name).set_eagle3_layers_to_capture
    stand_in = types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_last_rank=True),
        config=types.SimpleNamespace(num_hidden_layers=num_layers),
        model=types.SimpleNamespace(layers_to_capture=[]),
        capture_aux_hidden_states=False,
    )
    method(stand_in, None if ids is None else list(ids))
    assert stand_in.capture_aux_hidden_states is True
    return list(stand_in.model.layers_to_capture)


def id_sets(num_layers: int, seed: int) -> list[list[int]]:
    if num_layers <= 12:
        return [list(c) for k in (1, 2, 3, 4) for c in itertools.combinations(range(num_layers - 1), k)]
    rng = random.Random(seed)
    picked = [sorted(rng.sample(range(num_layers - 1), k)) for k in (3, 3, 3, 4, 5) for _ in range(40)]
    return [*picked, [1, 29, 57], [2, 30, 58], [3, 31, 59], [0, 30, 58], [1, 2, 3]]


def test_the_pinned_version_is_installed() -> None:
    assert sglang.__version__ == SGLANG_VERSION


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_layers", [7, 8, 12, 32, 61, 80])
def test_table_equals_sglangs_own_method(family: ModelFamily, num_layers: int) -> None:
    assert layers_to_capture(family, None, num_layers) == real_capture(family, None, num_layers)
    for ids in id_sets(num_layers, seed=num_layers):
        assert layers_to_capture(family, ids, num_layers) == real_capture(family, ids, num_layers), (family, ids)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_layers", [7, 8, 9, 16, 32, 61])
def test_default_aux_layers_are_what_sglang_captures_with_no_ids(family: ModelFamily, num_layers: int) -> None:
    assert capture_indices(default_aux_layer_ids(num_layers)) == real_capture(family, None, num_layers)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_layers", [8, 12, 61])
def test_draft_value_makes_sglang_capture_exactly_the_extracted_layers(family: ModelFamily, num_layers: int) -> None:
    expressible = 0
    for aux in id_sets(num_layers, seed=7 * num_layers):
        wanted = capture_indices(aux)
        try:
            value = draft_layer_ids(family, aux, num_layers)
        except ConfigError:
            # no value of the two forms works: then SGLang captures something else for both
            assert real_capture(family, aux, num_layers) != wanted
            assert real_capture(family, wanted, num_layers) != wanted
            assert family is ModelFamily.DEEPSEEK and aux[0] == 0
            continue
        expressible += 1
        assert real_capture(family, value, num_layers) == wanted, (family, aux, value)
        # the launcher, running beside SGLang, finds the same value with the real method
        assert layer_id_argument(family, aux, num_layers) == value
    assert expressible > 0


def test_the_kimi_values_of_the_issue() -> None:
    # the reference Kimi run's outputs [2, 30, 58] are served with [3, 31, 59]; the default [1, 29, 57] as is
    assert draft_layer_ids(ModelFamily.DEEPSEEK, [2, 30, 58], 61) == [3, 31, 59]
    assert draft_layer_ids(ModelFamily.DEEPSEEK, [1, 29, 57], 61) == [1, 29, 57]
    assert draft_layer_ids(ModelFamily.LLAMA, [2, 30, 58], 61) == [2, 30, 58]
    assert real_capture(ModelFamily.DEEPSEEK, [3, 31, 59], 61) == [3, 31, 59]


def test_kimi_k25_wrapper_delegates_to_the_deepseek_rules() -> None:
    inner = types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_last_rank=True),
        config=types.SimpleNamespace(num_hidden_layers=61),
        model=types.SimpleNamespace(layers_to_capture=[]),
        capture_aux_hidden_states=False,
    )
    inner.set_eagle3_layers_to_capture = types.MethodType(_sglang_method(ModelFamily.DEEPSEEK), inner)
    wrapper = types.SimpleNamespace(language_model=inner)
    for ids in ([1, 29, 57], [2, 30, 58], [3, 31, 59], None):
        KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture(wrapper, ids)
        assert inner.model.layers_to_capture == layers_to_capture(ModelFamily.DEEPSEEK, ids, 61)


def test_launcher_capture_uses_the_real_method() -> None:
    assert _sglang_method(ModelFamily.LLAMA).__qualname__ == "LlamaForCausalLM.set_eagle3_layers_to_capture"
    assert sglang_capture(ModelFamily.DEEPSEEK, [3, 31, 59], 61) == [3, 31, 59]
