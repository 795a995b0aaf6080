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

#: the two numberings a user meets, in words, for every message that shows a layer list
LAYER_IDS_NUMBERING = "0-based layer_ids: the output of decoder layer i, as --layer-ids and SpecForge count"
CAPTURE_NUMBERING = (
    "capture indices: the layer entered, layer_id + 1, as SGLang layers_to_capture, speculators --target-layer-ids "
    "and transformers hidden_states count"
)

#: what --layer-ids takes, for --help
LAYER_IDS_HELP = (
    "space- or comma-separated, 0-based: the output of decoder layer i (speculators --target-layer-ids and SGLang "
    "layers_to_capture count the layer entered, one more)"
)

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
            f"({ids}, {LAYER_IDS_NUMBERING}); set layer_ids explicitly or use a model with more layers"
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
            f"{num_layers} layers ({LAYER_IDS_NUMBERING}; the final layer {num_layers - 1} is always captured "
            f"separately); fix layer_ids{_if_capture_indices(ids, num_layers)}"
        )
    if sorted(set(ids)) != ids:
        raise ConfigError(
            f"aux layer_ids {ids} ({LAYER_IDS_NUMBERING}) must be strictly increasing without repeats; fix layer_ids"
        )
    return ids


def _if_capture_indices(ids: Sequence[int], num_layers: int) -> str:
    """The hint for ids that look copied from the capture-index numbering (one too high)."""
    lowered = [i - 1 for i in ids]
    if all(0 <= i < num_layers - 1 for i in lowered):
        return f". If these are {CAPTURE_NUMBERING}, subtract 1: --layer-ids {as_flag(lowered)}"
    return ""


def as_flag(ids: Sequence[int]) -> str:
    """A layer list as a --layer-ids value: ``1,3,4``."""
    return ",".join(str(i) for i in ids)


def server_layers_mismatch(configured: Sequence[int], served: Sequence[int]) -> str:
    """Why configured aux layer_ids and the server's differ, in both numberings, and the fix."""
    configured, served = list(configured), list(served)
    text = (
        f"layer_ids {configured} are configured but the server captures layer_ids {served} (both {LAYER_IDS_NUMBERING}; "
        f"the server's are capture indices {capture_indices(served)}, {CAPTURE_NUMBERING})"
    )
    if configured == capture_indices(served):
        return (
            f"{text}. The configured ids are the server's layers in the capture-index numbering: pass --layer-ids "
            f"{as_flag(served)}, or drop layer_ids to take the server's"
        )
    return f"{text}; restart the server with the same layers or drop layer_ids from the extractor config"


def layer_numbering_line(aux_layer_ids: Sequence[int], num_layers: int) -> str:
    """The end-of-run summary's line on the output's layers, in both numberings."""
    return (
        f"layers: aux layer_ids {list(aux_layer_ids)} and the final layer {num_layers - 1} ({LAYER_IDS_NUMBERING}) = "
        f"capture indices {capture_indices(aux_layer_ids)} ({CAPTURE_NUMBERING})"
    )


def capture_indices(aux_layer_ids: Sequence[int]) -> list[int]:
    """SGLang ``layers_to_capture`` (= HF ``hidden_states`` index) for 0-based aux layer ids."""
    return [i + 1 for i in aux_layer_ids]


def recorded_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """``layer_ids`` as recorded in data_config.json: the aux ids then the final layer N-1."""
    return [*aux_layer_ids, num_layers - 1]
