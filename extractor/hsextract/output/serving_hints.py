"""What an output tells the serving engine, so a drafter is served on the states it learned from
(``data_config.json`` ``serving`` and the end-of-run summary). The trainer's side (its settings and
defaults) is each format's own (:mod:`hsextract.output.formats`).

Neither trainer reads ``data_config.json``: a drafter trained on an output with a trainer's default
configuration, or with an ``eagle_aux_hidden_state_layer_ids`` that means other states to SGLang, is
served on other layers than it learned, silently. So every output states, for the layers it holds:

* the SGLang draft-config value (``eagle_config.eagle_aux_hidden_state_layer_ids``) that makes SGLang
  capture exactly these states for this model family (:mod:`hsextract.contract.sglang_capture`);
* its trainer's settings: SpecForge's config (``model.aux_hidden_state_layer_ids`` goes to SGLang's
  capture the same way, ``data.hidden_states_path``, ``data.max_length`` >= the longest sample), or
  speculators' flags (``--target-layer-ids`` in vLLM's "layer entered" numbering, ``--data-path``,
  ``--hidden-states-path``, ``--on-missing skip`` for rows the output does not hold,
  ``--total-seq-len`` >= the longest sample).

The trainer defaults live in the format modules (``formats/specforge.py``, ``formats/speculators.py``);
tests/trainers checks them, and the settings, against the released packages' own code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hsextract.contract.layers import capture_indices
from hsextract.contract.sglang_capture import SGLANG_VERSION, ModelFamily, draft_layer_ids

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SGLangServing:
    """How SGLang serves a drafter on these aux layers."""

    family: ModelFamily | None
    aux_layer_ids: list[int]
    num_layers: int
    #: the drafter's ``eagle_aux_hidden_state_layer_ids``; None when the family is unknown
    draft_layer_ids: list[int] | None

    @property
    def layers_to_capture(self) -> list[int]:
        return capture_indices(self.aux_layer_ids)

    def eagle_config(self) -> dict[str, Any] | None:
        if self.draft_layer_ids is None:
            return None
        return {"eagle_aux_hidden_state_layer_ids": self.draft_layer_ids, "use_aux_hidden_state": True}

    def to_json(self) -> dict[str, Any]:
        unknown = (
            None
            if self.family is not None
            else "the model family is unknown (config.json not readable here, or not a family whose SGLang numbering "
            "is checked); set architecture (--architecture) to get the value"
        )
        return {
            "engine": "sglang",
            "sglang_version": SGLANG_VERSION,
            "model_family": None if self.family is None else self.family.value,
            "eagle_aux_hidden_state_layer_ids": self.draft_layer_ids,
            "layers_to_capture": self.layers_to_capture,
            "draft_config": None if self.draft_layer_ids is None else {"eagle_config": self.eagle_config()},
            "no_value_because": unknown,
        }


def sglang_serving(family: ModelFamily | None, aux_layer_ids: list[int], num_layers: int) -> SGLangServing:
    """The serving value for these layers; raises ConfigError when SGLang cannot serve them."""
    value = None if family is None else draft_layer_ids(family, aux_layer_ids, num_layers)
    return SGLangServing(family, list(aux_layer_ids), num_layers, value)


def serving_line(serving: SGLangServing) -> str:
    """The end-of-run summary's line about serving a drafter trained on the output."""
    if serving.draft_layer_ids is not None:
        return (
            f"serve a drafter trained on it with eagle_config.eagle_aux_hidden_state_layer_ids {serving.draft_layer_ids} "
            f"(SGLang {SGLANG_VERSION}, {serving.family} family: captures hidden_states{serving.layers_to_capture}; "
            "hsextract draft-config / check-draft)"
        )
    return f"no SGLang draft-config value: {serving.to_json()['no_value_because']}"
