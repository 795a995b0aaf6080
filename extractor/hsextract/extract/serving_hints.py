"""What an output tells the serving engine and its trainer, so a drafter is served on the states it
learned from (``data_config.json`` ``serving`` and ``trainer``, and the end-of-run summary).

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

The trainer defaults below are the released packages' (SpecForge 0.2.0, speculators 0.9.0);
tests/trainers checks them, and these settings, against the packages' own code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.contract.layers import capture_indices
from hsextract.contract.sglang_capture import SGLANG_VERSION, ModelFamily, draft_layer_ids
from hsextract.extract.formats import format_class

log = logging.getLogger(__name__)

SPECFORGE_VERSION = "0.2.0"
SPECULATORS_VERSION = "0.9.0"
#: SpecForge ``data.max_length``: a longer sample loses its tail in the offline normalizer
SPECFORGE_DEFAULT_MAX_LENGTH = 2048
#: speculators ``--total-seq-len``: the packing budget; a longer sample is cut by the collator
SPECULATORS_DEFAULT_TOTAL_SEQ_LEN = 8192
#: SpecForge's EAGLE-3 draft takes exactly this many aux layers (``resolve_eagle_capture_layers``)
SPECFORGE_NUM_AUX_LAYERS = 3
#: the dtype SpecForge's target head and draft run in; its target head fails on any other input
SPECFORGE_DTYPE = "bfloat16"


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


def trainer_settings(format_name: str, serving: SGLangServing, longest_sample: int) -> dict[str, Any]:
    """The settings format ``format_name``'s trainer needs for this output (``data_config.json`` ``trainer``):
    the format's own (:meth:`~hsextract.extract.formats.base.OutputFormat.trainer_settings`)."""
    return format_class(format_name).trainer_settings(serving, longest_sample)


def speculators_args(trainer: dict[str, Any], output: Path) -> list[str]:
    """speculators' command-line flags for this output, paths resolved."""
    args: list[str] = []
    for flag, value in trainer["flags"].items():
        if flag in ("--data-path", "--hidden-states-path"):
            value = str(Path(output).resolve() / value)
        args += [flag, *(map(str, value) if isinstance(value, list) else [str(value)])]
    return args


def summary_lines(serving: SGLangServing, trainer: dict[str, Any], output: Path, format_name: str) -> list[str]:
    """The end-of-run summary's lines about serving and training."""
    lines = []
    if serving.draft_layer_ids is not None:
        lines.append(
            f"serve a drafter trained on it with eagle_config.eagle_aux_hidden_state_layer_ids {serving.draft_layer_ids} "
            f"(SGLang {SGLANG_VERSION}, {serving.family} family: captures hidden_states{serving.layers_to_capture}; "
            "hsextract draft-config / check-draft)"
        )
    else:
        lines.append(f"no SGLang draft-config value: {serving.to_json()['no_value_because']}")
    lines.append(format_class(format_name).trainer_summary(trainer, output))
    return lines
