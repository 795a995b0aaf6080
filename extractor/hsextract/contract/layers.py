"""The layer convention: which residual stream each number means.

Three numberings exist (docs/design-notes.md, "Layer numbering"):

* ``layer_ids`` (0-based): the decoder layer whose *output* is captured. The bundle's own
  numbering, written in every file. Default aux layers: ``[1, N//2-1, N-4]``.
* capture index (SGLang ``layers_to_capture``): the residual stream *entering* layer i, so
  ``layer_id + 1``.
* HF ``hidden_states[i]``: 0 is the embeddings, i is the output of layer i-1, so also
  ``layer_id + 1``; the last entry is the final state after the final norm.

What a *drafter's* ``eagle_aux_hidden_state_layer_ids`` means depends on the serving engine and
the model family: see :mod:`hsextract.contract.sglang_capture`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hsextract.errors import ConfigError

#: the default, in words, for --help and messages
DEFAULT_AUX_LAYERS_TEXT = (
    "outputs of layers [1, N//2-1, N-4] = transformers hidden_states[2, N//2, N-3], SGLang's and the trainers' default"
)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """The ecosystem's EAGLE-3 default: the outputs of layers ``[1, N//2-1, N-4]``.

    These are transformers ``hidden_states[2, N//2, N-3]``: what SGLang 0.5.23 captures with no
    ids configured (``layers_to_capture = [2, N//2, N-3]``, the streams *entering* those layers),
    what SpecForge assumes (``resolve_eagle_capture_layers``: ``[1, N//2-1, N-4]``) and what
    speculators assumes (``target_layer_ids = [2, N//2, N-3]``, the layer entered). A drafter
    trained on them with a trainer's default configuration is served on the same states."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if sorted(set(ids)) != ids or ids[0] < 0 or ids[-1] >= num_layers - 1:
        raise ConfigError(
            f"a model with {num_layers} layers has no three distinct default aux layers "
            f"({ids}); set layer_ids explicitly or use a model with more layers"
        )
    return ids


def resolve_aux_layer_ids(layer_ids: Sequence[int] | None, num_layers: int) -> list[int]:
    """Validate configured aux layer ids (0-based) against the model, or return the default."""
    if layer_ids is None or len(layer_ids) == 0:
        return default_aux_layer_ids(num_layers)
    ids = [int(i) for i in layer_ids]
    bad = [i for i in ids if not 0 <= i < num_layers - 1]
    if bad:
        raise ConfigError(
            f"aux layer_ids {ids} contain {bad}, outside 0..{num_layers - 2} for a model with "
            f"{num_layers} layers (the final layer {num_layers - 1} is always captured separately); "
            "fix layer_ids"
        )
    if sorted(set(ids)) != ids:
        raise ConfigError(f"aux layer_ids {ids} must be strictly increasing without repeats; fix layer_ids")
    return ids


def capture_indices(aux_layer_ids: Sequence[int]) -> list[int]:
    """SGLang ``layers_to_capture`` (= HF ``hidden_states`` index) for 0-based aux layer ids."""
    return [i + 1 for i in aux_layer_ids]


def recorded_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """``layer_ids`` as recorded in data_config.json: the aux ids then the final layer N-1."""
    return [*aux_layer_ids, num_layers - 1]
