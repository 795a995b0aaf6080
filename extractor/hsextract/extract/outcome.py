"""What a run leaves and tells: ``data_config.json`` (:func:`build_data_config`), the end-of-run summary
(:class:`RunSummary`, :func:`summarize`) and its hints on serving and training the output (:func:`summary_lines`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hsextract import __version__
from hsextract.contract.layers import capture_indices, layer_numbering_line, recorded_layer_ids
from hsextract.contract.states import ErrorKind, RunStatus
from hsextract.extract.checks.spot_check import SpotCheckCounts
from hsextract.extract.ledger import Ledger
from hsextract.extract.planning.plan import Plan
from hsextract.extract.setup import RunSetup
from hsextract.output.data_config import DATA_FORMAT_VERSION, DataConfig, loss_mask_source, previous_data_config
from hsextract.output.formats import format_class
from hsextract.output.manifest import Manifest
from hsextract.output.serving_hints import SGLangServing, serving_line


@dataclass
class RunSummary:
    status: RunStatus
    output: Path
    rows_in_shard: int
    written_now: int
    resumed: int
    bad_input: int
    failed: int
    truncated: int
    total_samples: int
    total_tokens: int
    seconds: float
    fatal_error: str | None = None
    stop_reason: str | None = None
    #: how to serve and train on the output (data_config.json ``serving`` and ``trainer``)
    hints: tuple[str, ...] = ()
    #: rows written from their dump whose HTTP answer did not follow within answer_grace_s
    late_answers: int = 0
    #: the longest a complete dump waited before the extractor took it up
    longest_dump_pickup_s: float = 0.0
    #: times the server stopped taking connections mid-run and the run waited for it (server_gate)
    server_outages: int = 0
    #: why data_config.json could not be written at the end (a full disk); None: it was written
    data_config_not_written: str | None = None


def trainable(data_config: DataConfig) -> bool:
    """Whether the output is one to train on: complete, with samples (a partial output would train on a subset)."""
    return data_config.complete and data_config.total_samples > 0 and data_config.trainer is not None


def summary_lines(serving: SGLangServing, data_config: DataConfig, output: Path) -> list[str]:
    """The end-of-run summary's lines about serving (SGLang's value) and training (the format's trainer command,
    for a complete output with samples only)."""
    lines = [serving_line(serving)]
    if trainable(data_config) and data_config.trainer is not None and data_config.format is not None:
        lines += format_class(data_config.format).trainer_summary(data_config.trainer, output, data_config.model.path)
    else:
        lines.append(
            f"no train command: the output is {data_config.status or 'unfinished'} with {data_config.total_samples} "
            "samples; train once a run has completed"
        )
    return lines


def storage_hint(data_config: DataConfig) -> tuple[str, ...]:
    """The summary line of an FP8 output: what it holds and the trainer flag that reads it."""
    quantization = data_config.quantization
    if quantization is None:
        return ()
    flags = " ".join(f"{k} {v}" for k, v in quantization["trainer_flags"].items())
    return (
        f"stored as {data_config.dtype} ({quantization['scheme']}; scales in {quantization['scales_key']}): the trainer "
        f"reads it only with {flags}",
    )


def summarize(
    setup: RunSetup,
    data_config: DataConfig,
    ledger: Ledger,
    plan: Plan,
    *,
    seconds: float,
    server_outages: int,
    spot_checks: SpotCheckCounts | None = None,
    data_config_not_written: str | None = None,
) -> RunSummary:
    """The run's summary from what it wrote (``data_config``) and what its ledger counted; ``data_config_not_written``:
    why ``data_config`` could not be written to the output (None: it was)."""
    cfg = setup.config
    errors = ledger.manifest.errors.values()
    status, stop_reason = RunStatus(data_config.status), data_config.stop_reason
    hints = summary_lines(setup.serving, data_config, cfg.output)
    hints.insert(0, layer_numbering_line(setup.aux_layer_ids, setup.server.num_layers))  # which numbering the lists use
    return RunSummary(
        status=status,
        output=cfg.output,
        rows_in_shard=plan.rows_in_shard,
        written_now=ledger.written_now,
        resumed=plan.settled,
        bad_input=sum(1 for e in errors if e.kind is ErrorKind.BAD_INPUT),
        failed=sum(1 for e in errors if e.kind is ErrorKind.FAILED),
        truncated=data_config.truncated_samples,
        total_samples=data_config.total_samples,
        total_tokens=data_config.total_tokens,
        seconds=seconds,
        fatal_error=ledger.fatal_text(),
        stop_reason=stop_reason,
        hints=tuple(hints) + storage_hint(data_config) + (() if spot_checks is None else (spot_checks.summary_line(),)),
        late_answers=ledger.late_answers,
        longest_dump_pickup_s=ledger.longest_dump_pickup_s,
        server_outages=server_outages,
        data_config_not_written=data_config_not_written,
    )


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_data_config(
    setup: RunSetup,
    manifest: Manifest,
    rows_in_shard: int,
    status: RunStatus,
    stop_reason: str | None = None,
    planned_longest: int = 0,
    spot_checks: SpotCheckCounts | None = None,
) -> DataConfig:
    """``data_config.json`` of the output as the manifest holds it now (``setup.identity``: the output's identity).
    ``planned_longest``: the longest sample of the dataset plan (rows not written yet included), so the trainer
    settings of a run stopped early already fit every sample the output will hold."""
    config, identity, aux_layer_ids, fmt, serving = setup.config, setup.server, setup.aux_layer_ids, setup.fmt, setup.serving
    output_identity, computed_dtype = setup.identity, setup.computed_dtype
    written = manifest.written.values()
    truncated = [s for s in written if s.truncated]
    errors = list(manifest.errors.values())
    previous = previous_data_config(config.output)
    longest = max((s.num_tokens for s in written), default=0)
    without_mask = sum(1 for s in written if not s.loss_mask_given)
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
        "samples_without_loss_mask": without_mask,
        "loss_mask_source": loss_mask_source(without_mask, len(manifest.written)),
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
        "trainer": fmt.trainer_settings(serving, max(longest, planned_longest), stored_dtype),
        "engine": identity.engine,
        "dataset": str(Path(config.dataset).resolve()),
        "dataset_fingerprint": output_identity.dataset.fingerprint if output_identity else None,
        "dataset_preparation": setup.dataset_preparation,
        "extractor_version": __version__,
        "created_at": created_at,
        "updated_at": _now(),
        "created_unix": created_unix,
    }
    if spot_checks is not None:
        fields["spot_checks"] = spot_checks.to_json()
    if quantization is not None:  # an unquantized output's file keeps exactly its keys
        fields["quantization"] = quantization
    return DataConfig.model_validate(fields)
