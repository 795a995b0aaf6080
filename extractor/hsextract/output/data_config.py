"""``<out>/data_config.json``: what the output holds and how it was made (docs/design-notes.md, "Output")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hsextract.contract.states import RunStatus
from hsextract.durable.atomic import atomic_write_bytes
from hsextract.errors import OutputError

DATA_CONFIG_FILE = "data_config.json"
DATA_FORMAT_VERSION = 1


class _Record(BaseModel):
    # Fields another hsextract version wrote are kept (a merge carries them over); a file read back
    # records which fields it had (``exclude_unset``), so an older output's absent key stays absent.
    model_config = ConfigDict(extra="allow")


def loss_mask_source(without: int, total: int) -> str:
    """``loss_mask_source``: the dataset's masks, all ones (no row had one), or which share had none."""
    if without == 0:
        return "the dataset's loss_mask"
    if without == total:
        return "all ones: the dataset had none"
    return f"mixed: {without} of {total} samples had no loss_mask in the dataset (all ones there)"


class ModelRecord(_Record):
    """``data_config.json`` ``model``: the model the states came from."""

    path: str = ""
    fingerprint: str | None = None
    num_hidden_layers: int | None = None
    family: str | None = None


class DataConfig(_Record):
    """``<out>/data_config.json``: what the output holds and how it was made. The JSON keys are the
    fields, in this order (trainers' tooling and the tests read them by name). Required are the layers
    (every reader needs them); a field with a default has the value an output that never recorded it
    means, and ``verify`` refuses an output without its format, sizes and max_seq_len."""

    extraction_method: str = ""
    format: str | None = None
    data_format_version: int = DATA_FORMAT_VERSION
    layer_ids: list[int] = Field(default_factory=list)
    layer_ids_convention: str = ""
    aux_layer_ids: list[int]
    sglang_layers_to_capture: list[int] = Field(default_factory=list)
    hf_hidden_states_indices: list[int] = Field(default_factory=list)
    final_layer_id: int | None = None
    final_norm_applied: bool | None = None
    num_layers_captured: int | None = None
    num_hidden_layers: int
    hidden_size: int | None = None
    vocab_size: int | None = None
    #: what the sample files hold
    dtype: str | None = None
    #: what the server computed (a format may convert: specforge stores bfloat16)
    computed_dtype: str | None = None
    dtype_conversion: str | None = None
    max_seq_len: int | None = None
    total_samples: int = 0
    total_tokens: int = 0
    total_bytes: int = 0
    truncated_samples: int = 0
    truncated_tokens: int = 0
    #: samples whose dataset row had no loss_mask (trained on every token, prompts included)
    samples_without_loss_mask: int = 0
    #: where the loss masks came from (:func:`loss_mask_source`)
    loss_mask_source: str | None = None
    longest_sample_tokens: int = 0
    bad_input_samples: int = 0
    failed_samples: int = 0
    error_counts: dict[str, int] = Field(default_factory=dict)
    rows_in_shard: int = 0
    shard_index: int = 0
    num_shards: int = 1
    #: a :class:`~hsextract.contract.states.RunStatus` value
    status: str = ""
    stop_reason: str | None = None
    model: ModelRecord = Field(default_factory=ModelRecord)
    #: how SGLang serves a drafter on these layers (serving_hints.SGLangServing.to_json)
    serving: dict[str, Any] | None = None
    #: the format's trainer settings (OutputFormat.trainer_settings)
    trainer: dict[str, Any] | None = None
    engine: str | None = None
    dataset: str | None = None
    dataset_fingerprint: str | None = None
    #: a dataset made by ``hsextract prepare``: its prepare.json settings and counts (tokenizer, template, --like)
    dataset_preparation: dict[str, Any] | None = None
    extractor_version: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    created_unix: float | None = None
    #: an FP8 output only: how it was quantized and the trainer flags that read it (OutputFormat.quantization)
    quantization: dict[str, Any] | None = None
    #: this run's checks of rows against the engine's own hidden states (extract.spot_check.SpotCheckCounts)
    spot_checks: dict[str, Any] | None = None
    # -- a merged output only (hsextract merge) ---------------------------------------------------------
    merged_at: str | None = None
    merged_from: list[dict[str, Any]] | None = None
    merge_files: dict[str, int] | None = None
    # -- hsextract pipeline only: where the dataset's rows came from (hsextract/pipeline.py) ------------
    #: {"regenerate": {output, identity, server, counts}, "prepare": {output, settings, counts, ...}}
    sources: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        return self.status == RunStatus.COMPLETE.value

    def to_json(self) -> dict[str, Any]:
        """The file's content: every field set when it was built or read (an older output's absent keys stay absent)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_json(cls, data: Any, where: Path) -> DataConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {'missing' if e['type'] == 'missing' else e['msg']}" for e in exc.errors()
            )
            raise OutputError(
                f"{where} is not a data_config.json of this hsextract ({problems}); rerun the extraction "
                "(same command) to rewrite it"
            ) from None


def read_data_config(output: Path) -> DataConfig | None:
    """The output's data_config.json; None when there is none. OutputError when it is damaged."""
    path = Path(output) / DATA_CONFIG_FILE
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OutputError(f"{path} cannot be read ({exc}); rerun the extraction (same command) to rewrite it") from None
    if not isinstance(loaded, dict):
        raise OutputError(f"{path} is not a JSON object; rerun the extraction (same command) to rewrite it")
    return DataConfig.from_json(loaded, path)


def previous_data_config(output: Path) -> DataConfig | None:
    """The output's data_config.json as an earlier run left it; None when there is none or it is damaged."""
    try:
        return read_data_config(output)
    except OutputError:
        return None


def write_data_config(output: Path, data: DataConfig) -> None:
    atomic_write_bytes(Path(output) / DATA_CONFIG_FILE, (json.dumps(data.to_json(), indent=2) + "\n").encode())


def record_sources(output: Path, sources: dict[str, Any]) -> None:
    """Set ``sources`` in a written data_config.json (atomically); the rest of it stays as it is."""
    config = read_data_config(output)
    if config is None:
        raise OutputError(f"{output} has no data_config.json to record the sources in; run the extraction first")
    config.sources = sources
    write_data_config(output, config)
