"""``<out>/data_config.json``: what the output holds and how it was made (docs/design-notes.md, "Output")."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hsextract import __version__
from hsextract.contract.atomic import atomic_write_bytes
from hsextract.contract.layers import capture_indices, recorded_layer_ids
from hsextract.contract.states import ErrorKind, RunStatus
from hsextract.errors import OutputError
from hsextract.extract.serving_hints import SGLangServing

if TYPE_CHECKING:
    from hsextract.config import ExtractConfig
    from hsextract.contract.server_info import ServerInfo
    from hsextract.extract.formats.base import OutputFormat
    from hsextract.extract.identity import OutputIdentity
    from hsextract.extract.manifest import Manifest

DATA_CONFIG_FILE = "data_config.json"
DATA_FORMAT_VERSION = 1
#: fields that legitimately differ between two runs producing the same data
VOLATILE_FIELDS = ("created_at", "updated_at", "created_unix", "extractor_version")


class _Record(BaseModel):
    # Fields another hsextract version wrote are kept (a merge carries them over); a file read back
    # records which fields it had (``exclude_unset``), so an older output's absent key stays absent.
    model_config = ConfigDict(extra="allow")


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
    extractor_version: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    created_unix: float | None = None
    #: an FP8 output only: how it was quantized and the trainer flags that read it (OutputFormat.quantization)
    quantization: dict[str, Any] | None = None
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


def _previous(output: Path) -> DataConfig | None:
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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_data_config(
    config: ExtractConfig,
    identity: ServerInfo,
    aux_layer_ids: list[int],
    fmt: OutputFormat,
    manifest: Manifest,
    rows_in_shard: int,
    status: RunStatus,
    serving: SGLangServing,
    computed_dtype: str | None,
    *,
    output_identity: OutputIdentity | None = None,
    stop_reason: str | None = None,
) -> DataConfig:
    written = manifest.written.values()
    truncated = [s for s in written if s.truncated]
    errors = list(manifest.errors.values())
    previous = _previous(config.output)
    longest = max((s.num_tokens for s in written), default=0)
    stored_dtype = fmt.stored_dtype_for(computed_dtype, config.storage)
    quantization = fmt.quantization(stored_dtype)
    conversion = None
    if quantization is not None:
        conversion = f"{computed_dtype} -> {stored_dtype} on the server ({quantization['scheme']})"
    elif computed_dtype is not None and stored_dtype != computed_dtype:
        conversion = f"{computed_dtype} -> {stored_dtype} at packing (format {fmt.name}: its trainer runs in {stored_dtype})"
    created_at = previous.created_at if previous is not None and previous.created_at else _now()
    created_unix = previous.created_unix if previous is not None and previous.created_unix is not None else time.time()
    fields = {
        "extraction_method": f"hsextract dump hook ({identity.engine})",
        "format": fmt.name,
        "data_format_version": DATA_FORMAT_VERSION,
        "layer_ids": recorded_layer_ids(aux_layer_ids, identity.num_layers),
        "layer_ids_convention": "0-based index of the decoder layer whose output is captured; last = final layer",
        "aux_layer_ids": aux_layer_ids,
        "sglang_layers_to_capture": capture_indices(aux_layer_ids),
        "hf_hidden_states_indices": [*capture_indices(aux_layer_ids), identity.num_layers],
        "final_layer_id": identity.num_layers - 1,
        "final_norm_applied": fmt.final_norm_applied,
        "num_layers_captured": len(aux_layer_ids) + 1,
        "num_hidden_layers": identity.num_layers,
        "hidden_size": identity.hidden_size,
        "vocab_size": identity.vocab_size,
        "dtype": stored_dtype,
        "computed_dtype": computed_dtype,
        "dtype_conversion": conversion,
        "max_seq_len": config.max_seq_len,
        "total_samples": len(manifest.written),
        "total_tokens": sum(s.num_tokens for s in written),
        "total_bytes": sum(s.bytes for s in written),
        "truncated_samples": len(truncated),
        "truncated_tokens": sum(s.original_length - s.num_tokens for s in truncated),
        "longest_sample_tokens": longest,
        "bad_input_samples": sum(1 for e in errors if e.kind is ErrorKind.BAD_INPUT),
        "failed_samples": sum(1 for e in errors if e.kind is ErrorKind.FAILED),
        "error_counts": dict(sorted(Counter(e.reason for e in errors).items())),
        "rows_in_shard": rows_in_shard,
        "shard_index": config.shard_index,
        "num_shards": config.num_shards,
        "status": status.value,
        "stop_reason": stop_reason,
        "model": {
            "path": output_identity.model.path if output_identity else identity.model_path,
            "fingerprint": output_identity.model.fingerprint if output_identity else identity.model_fingerprint,
            "num_hidden_layers": identity.num_layers,
            "family": None if serving.family is None else serving.family.value,
        },
        "serving": serving.to_json(),
        "trainer": fmt.trainer_settings(serving, longest, stored_dtype),
        "engine": identity.engine,
        "dataset": str(Path(config.dataset).resolve()),
        "dataset_fingerprint": output_identity.dataset.fingerprint if output_identity else None,
        "extractor_version": __version__,
        "created_at": created_at,
        "updated_at": _now(),
        "created_unix": created_unix,
    }
    if quantization is not None:  # an unquantized output's file keeps exactly its keys
        fields["quantization"] = quantization
    return DataConfig.model_validate(fields)
