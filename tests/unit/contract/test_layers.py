"""Layer numbering: the default aux layers, validation, and the other two numberings."""

from __future__ import annotations

import pytest

from hsextract.contract.layers import capture_indices, default_aux_layer_ids, recorded_layer_ids, resolve_aux_layer_ids
from hsextract.dev.tiny_model import make_tiny_model, min_layers
from hsextract.errors import ConfigError


@pytest.mark.parametrize("num_layers", [7, 8, 32, 61])
def test_default_is_three_distinct_layers_below_the_last(num_layers: int) -> None:
    ids = default_aux_layer_ids(num_layers)
    assert len(ids) == 3 and ids == sorted(set(ids))
    assert ids[0] >= 0 and ids[-1] < num_layers - 1
    assert resolve_aux_layer_ids(None, num_layers) == ids == resolve_aux_layer_ids([], num_layers)


def test_too_few_layers_for_the_default_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="set layer_ids explicitly"):
        default_aux_layer_ids(min_layers() - 1)


def test_tiny_model_refuses_a_layer_count_serve_would_refuse(tmp_path) -> None:
    # make-tiny-model --layers 6 used to write a model that `serve` then refused
    with pytest.raises(ConfigError, match=f"choose --layers {min_layers()} or more"):
        make_tiny_model(tmp_path / "m", layers=min_layers() - 1)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("ids", "message"),
    [([2, 30, 60], r"outside 0\.\.59"), ([-1, 3], "outside"), ([5, 3], "strictly increasing"), ([3, 3], "strictly increasing")],
)
def test_bad_explicit_ids_are_refused_with_the_fix(ids: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_aux_layer_ids(ids, 61)


def test_the_three_numberings_of_the_reference_run() -> None:
    ids = resolve_aux_layer_ids([2, 30, 58], 61)
    assert capture_indices(ids) == [3, 31, 59]  # SGLang layers_to_capture = HF hidden_states index
    assert recorded_layer_ids(ids, 61) == [2, 30, 58, 60]


@pytest.mark.parametrize("num_layers", [7, 8, 32, 61, 80])
def test_default_is_hidden_states_2_half_and_n_minus_3(num_layers: int) -> None:
    # outputs [1, N//2-1, N-4]: the states SGLang captures with no ids, SpecForge's and speculators' default
    ids = default_aux_layer_ids(num_layers)
    assert ids == [1, num_layers // 2 - 1, num_layers - 4]
    assert capture_indices(ids) == [2, num_layers // 2, num_layers - 3]


def test_kimi_default() -> None:
    assert default_aux_layer_ids(61) == [1, 29, 57]  # SpecForge's DeepSeek-V3 draft config says [1, 29, 57]


# -- the two numberings in every message (issue 29, item 7) -------------------------------------------------
def test_ids_copied_from_the_capture_numbering_are_explained_with_the_fix() -> None:
    from hsextract.contract.layers import server_layers_mismatch

    message = server_layers_mismatch([2, 4, 5], [1, 3, 4])
    assert "layer_ids [2, 4, 5] are configured but the server captures layer_ids [1, 3, 4]" in message
    assert "0-based layer_ids: the output of decoder layer i" in message
    assert "capture indices [2, 4, 5]" in message and "speculators --target-layer-ids" in message
    assert "pass --layer-ids 1,3,4" in message
    other = server_layers_mismatch([1, 2, 4], [1, 3, 4])
    assert "0-based layer_ids" in other and "restart the server with the same layers" in other
    assert "pass --layer-ids" not in other


def test_out_of_range_ids_name_their_numbering_and_the_capture_index_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_aux_layer_ids([2, 4, 7], 8)  # speculators' --target-layer-ids of a model's last aux layer
    message = str(caught.value)
    assert "0-based layer_ids: the output of decoder layer i" in message
    assert "If these are capture indices" in message and "subtract 1: --layer-ids 1,3,6" in message


def test_the_summary_line_gives_both_numberings() -> None:
    from hsextract.contract.layers import layer_numbering_line

    line = layer_numbering_line([1, 3, 4], 8)
    assert line.startswith("layers: aux layer_ids [1, 3, 4] and the final layer 7 (0-based layer_ids")
    assert "= capture indices [2, 4, 5] (capture indices: the layer entered, layer_id + 1" in line
