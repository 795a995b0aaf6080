"""A drafter's ``config.json`` against an output: which states SGLang would serve it, and the fix.

``hsextract draft-config OUT [--write FILE]`` gives (or writes into a drafter's config.json) the
``eagle_config`` that makes SGLang serve the drafter on exactly the states OUT holds.
``hsextract check-draft OUT --draft-config FILE`` reads a drafter config the way SGLang 0.5.23 does
and says whether serving it would feed it the states it was trained on.

How SGLang 0.5.23 reads a drafter config for EAGLE-3 capture (``spec_aux_hidden_state.py``):
``eagle_config.use_aux_hidden_state`` (default true) turns capture on; the ids come from
``eagle_config.eagle_aux_hidden_state_layer_ids`` only: without them the target captures its
default ``[2, N//2, N-3]``, whatever else the config says. The drafter's input width counts
``num_aux_hidden_states``, else the ids (also a top-level ``eagle_aux_hidden_state_layer_ids``),
else 3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.contract.layers import capture_indices
from hsextract.contract.sglang_capture import (
    SGLANG_VERSION,
    ModelFamily,
    captured_states,
    draft_layer_ids,
    layers_to_capture,
    parse_family,
)
from hsextract.durable.atomic import atomic_write_bytes
from hsextract.errors import ConfigError, OutputError
from hsextract.output.data_config import read_data_config


@dataclass(frozen=True)
class OutputLayers:
    """The layers an output holds, as data_config.json records them."""

    output: Path
    aux_layer_ids: list[int]
    num_layers: int
    family: ModelFamily | None

    @property
    def hidden_states(self) -> list[int]:
        return capture_indices(self.aux_layer_ids)


def read_output_layers(output: Path, family: str | None = None) -> OutputLayers:
    config = read_data_config(Path(output))
    if config is None:
        raise OutputError(f"{output} has no data_config.json; give the output directory of hsextract extract")
    chosen = family or config.model.family
    return OutputLayers(
        output=Path(output),
        aux_layer_ids=list(config.aux_layer_ids),
        num_layers=config.num_hidden_layers,
        family=None if chosen is None else parse_family(str(chosen)),
    )


def known_family(layers: OutputLayers) -> ModelFamily:
    if layers.family is None:
        raise ConfigError(
            f"{layers.output}/data_config.json records no model family (its config.json was not readable at extraction); "
            "give it with --family deepseek|llama|qwen2"
        )
    return layers.family


def draft_value(layers: OutputLayers) -> list[int]:
    """The drafter's ``eagle_aux_hidden_state_layer_ids`` for the output; ConfigError when none serves it."""
    return draft_layer_ids(known_family(layers), layers.aux_layer_ids, layers.num_layers)


def eagle_config_for(layers: OutputLayers) -> dict[str, Any]:
    """The ``eagle_config`` a drafter trained on the output needs."""
    return {"eagle_aux_hidden_state_layer_ids": draft_value(layers), "use_aux_hidden_state": True}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"drafter config {path} does not exist; give the drafter's config.json") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"drafter config {path} is not readable JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"drafter config {path} is not a JSON object; give the drafter's config.json")
    return loaded


def write_eagle_config(layers: OutputLayers, draft_config: Path) -> dict[str, Any]:
    """Set ``eagle_config`` in an existing drafter config.json (other keys kept); atomic."""
    config = _read_json(draft_config)
    eagle = dict(config.get("eagle_config") or {})
    eagle.update(eagle_config_for(layers))
    config["eagle_config"] = eagle
    count = config.get("num_aux_hidden_states")
    if count is not None and int(count) != len(layers.aux_layer_ids):
        raise ConfigError(
            f"drafter config {draft_config} has num_aux_hidden_states {count}, but {layers.output} holds "
            f"{len(layers.aux_layer_ids)} aux layers: this drafter's input width does not fit these states; "
            "train a drafter for this output"
        )
    atomic_write_bytes(Path(draft_config), (json.dumps(config, indent=2) + "\n").encode())
    return config


@dataclass(frozen=True)
class DraftCheck:
    ok: bool
    #: what SGLang would feed the drafter: transformers hidden_states indices (None: no aux states)
    served: list[int] | None
    #: what the output holds
    trained: list[int]
    message: str


def check_draft(layers: OutputLayers, draft_config: Path) -> DraftCheck:
    """Would SGLang serve this drafter on the states the output holds?"""
    family = known_family(layers)
    value = draft_value(layers)
    config = _read_json(draft_config)
    eagle = config.get("eagle_config")
    eagle = eagle if isinstance(eagle, dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    top_level = config.get("eagle_aux_hidden_state_layer_ids")
    count = config.get("num_aux_hidden_states") or len(ids or top_level or []) or 3
    trained = layers.hidden_states
    fix = (
        f"set eagle_config.eagle_aux_hidden_state_layer_ids to {value} "
        f"(hsextract draft-config {layers.output} --write {draft_config})"
    )
    where = f"SGLang {SGLANG_VERSION}, {family} family"
    if not eagle.get("use_aux_hidden_state", True):
        return DraftCheck(
            False,
            None,
            trained,
            f"{draft_config} turns use_aux_hidden_state off: {where} feeds it no aux states, but {layers.output} holds "
            f"hidden_states{trained}; {fix}",
        )
    served = captured_states(layers_to_capture(family, None if ids is None else [int(i) for i in ids], layers.num_layers))
    said = (
        f"eagle_aux_hidden_state_layer_ids {list(ids)}"
        if ids is not None
        else "no eagle_config.eagle_aux_hidden_state_layer_ids"
        + (f" (a top-level {top_level} is not read for capture)" if top_level is not None else "")
    )
    if served != trained:
        return DraftCheck(
            False,
            served,
            trained,
            f"{draft_config}: {said} -> {where} serves the drafter hidden_states{served} (layer outputs "
            f"{[i - 1 for i in served]}), but {layers.output} holds hidden_states{trained} (layer outputs "
            f"{layers.aux_layer_ids}); {fix}",
        )
    if int(count) != len(trained):
        return DraftCheck(
            False,
            served,
            trained,
            f"{draft_config}: the drafter takes {count} aux states, {layers.output} holds {len(trained)}; "
            "train a drafter for this output",
        )
    return DraftCheck(
        True, served, trained, f"{draft_config}: {said} -> {where} serves hidden_states{served}, the states {layers.output} holds"
    )
