"""``hsextract verify``: re-read a whole output directory and check it against its metadata.

Every problem is a line naming the file and what to do; nothing in the output, however damaged,
gives a traceback. A run that has not finished (killed: ``identity.json`` but no
``data_config.json``) is reported as such, and its samples are still checked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract.contract.files.finite import all_finite
from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.durable.atomic import is_temp_name
from hsextract.errors import ConfigError, OutputError
from hsextract.output.checksum import check_sample_file
from hsextract.output.data_config import DataConfig, read_data_config
from hsextract.output.formats import FORMATS, open_format
from hsextract.output.formats.base import OutputFormat
from hsextract.output.identity import IDENTITY_FILE, OutputIdentity, read_identity
from hsextract.output.manifest import ERRORS_FILE, SAMPLES_FILE, read_jsonl

log = logging.getLogger(__name__)

_REDO = "rerun `hsextract extract` with the same settings: it redoes damaged and missing samples"


@dataclass
class VerifyReport:
    output: Path
    samples: int = 0
    tokens: int = 0
    errors_recorded: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"{len(self.problems)} PROBLEM(S)"
        lines = [
            f"{self.output}: {verdict}",
            f"  samples checked: {self.samples}, tokens: {self.tokens}, rows in errors.jsonl: {self.errors_recorded}",
        ]
        lines += [f"  - {p}" for p in self.problems[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Expect:
    format: str
    hidden_size: int
    num_aux: int
    max_seq_len: int
    dtype: str | None


def _expectations(output: Path, config: DataConfig | None, identity: OutputIdentity | None) -> _Expect:
    if config is not None:
        if config.format is None or config.hidden_size is None or config.max_seq_len is None:
            lacks = [k for k in ("format", "hidden_size", "max_seq_len") if getattr(config, k) is None]
            raise OutputError(
                f"{output}/data_config.json lacks {', '.join(lacks)}; rerun the extraction (same command) to rewrite it"
            )
        return _Expect(config.format, config.hidden_size, len(config.aux_layer_ids), config.max_seq_len, config.dtype)
    assert identity is not None
    dtype = identity.stored_dtype or identity.dtype
    return _Expect(identity.format, identity.hidden_size, len(identity.aux_layer_ids), identity.max_seq_len, dtype)


def verify_output(output: Path, on_sample: Callable[[], None] | None = None) -> VerifyReport:
    output = Path(output)
    report = VerifyReport(output)
    problem = report.problems.append
    if not output.exists():
        raise ConfigError(f"{output} does not exist; give hsextract verify an output directory of hsextract extract (the "
                          "--output it was given): check the path")
    if not output.is_dir():
        raise ConfigError(f"{output} is a file, not a directory; give hsextract verify the output directory of hsextract "
                          "extract (the --output it was given), not a file in it")
    config = read_data_config(output)
    identity = read_identity(output)
    if config is None and identity is None:
        raise OutputError(f"{output} has no data_config.json nor {IDENTITY_FILE}: it is not an hsextract output directory "
                          "(or its extraction never started); give hsextract verify the --output directory of hsextract extract")
    if config is None:
        problem(
            "the run has not finished (no data_config.json: it was killed or is still running); rerun `hsextract "
            "extract` with the same settings to finish it"
        )
    expect = _expectations(output, config, identity)
    if expect.format not in FORMATS:
        raise OutputError(f"{output} names format {expect.format!r}, which this hsextract does not know")
    if identity is not None and config is not None:
        for key, recorded in (
            ("format", identity.format),
            ("aux_layer_ids", identity.aux_layer_ids),
            ("hidden_size", identity.hidden_size),
            ("max_seq_len", identity.max_seq_len),
        ):
            if getattr(config, key) != recorded:
                problem(f"data_config.json says {key} {getattr(config, key)!r}, {IDENTITY_FILE} {recorded!r}")
    fmt = open_format(expect.format, output)
    samples_file = read_jsonl(output / SAMPLES_FILE)
    errors_file = read_jsonl(output / ERRORS_FILE)
    for name, content in ((SAMPLES_FILE, samples_file), (ERRORS_FILE, errors_file)):
        for line in content.torn_lines:
            problem(f"{name} line {line} is torn or not a record (a run was killed while writing it); {_REDO}")
    samples = {int(r["row"]): r for r in samples_file.records}  # a later line for a row wins, as in the run
    report.errors_recorded = len(errors_file.records)
    for row in sorted(samples):
        _verify_sample(output, fmt, row, samples[row], expect, report)
        if on_sample is not None:
            on_sample()
    _verify_totals(config, samples, report)
    overlap = set(samples) & {int(e["row"]) for e in errors_file.records}
    if overlap:
        problem(f"rows both written and in errors.jsonl: {sorted(overlap)[:10]}")
    if config is not None and not config.complete:
        reason = f" ({config.stop_reason})" if config.stop_reason else ""
        problem(f"the run's status is {config.status!r}{reason}, not 'complete'; rerun the extraction to finish it")
    strays = [p for p in output.rglob(".*") if is_temp_name(p.name)]
    if strays:
        problem(f"{len(strays)} temporary files left, e.g. {strays[0]}")
    on_disk = set(fmt.sample_files())
    listed = {fmt.sample_path(r) for r in samples}
    if on_disk - listed:
        problem(f"{len(on_disk - listed)} sample files not listed in samples.jsonl, e.g. {sorted(on_disk - listed)[0]}")
    if config is not None:
        fmt.verify_index(set(samples), problem)
    return report


def _verify_sample(
    output: Path, fmt: OutputFormat, row: int, record: dict[str, Any], expect: _Expect, report: VerifyReport
) -> None:
    problem = report.problems.append
    file = str(record.get("file", ""))
    if file != fmt.relative(row):
        problem(f"row {row}: samples.jsonl names {file!r}, but the {fmt.name} format keeps it at {fmt.relative(row)}; {_REDO}")
        return
    try:
        recorded_size = int(record["bytes"])
    except (KeyError, TypeError, ValueError):
        problem(f"row {row}: its samples.jsonl record has no byte count; {_REDO}")
        return
    damage = check_sample_file(
        output / file, recorded_size, record.get("checksum"), with_checksum=record.get("checksum") is not None
    )
    if damage is not None:
        problem(f"row {row}: {output / file} {damage}; {_REDO}")
        return
    try:
        stored = fmt.read_sample(row)
    except Exception as exc:  # any reader error on a damaged file is a finding, not a crash
        problem(f"row {row}: {output / file} cannot be read ({type(exc).__name__}: {exc}); {_REDO}")
        return
    tokens = int(stored.input_ids.shape[0])
    if tokens != record.get("num_tokens"):
        problem(f"row {row}: {tokens} tokens in the file, {record.get('num_tokens')} in samples.jsonl")
    if tokens > expect.max_seq_len:
        problem(f"row {row}: {tokens} tokens exceed max_seq_len {expect.max_seq_len}")
    want_aux = (tokens, expect.num_aux, expect.hidden_size)
    if tuple(stored.aux_hidden_states.shape) != want_aux:
        problem(f"row {row}: aux states {tuple(stored.aux_hidden_states.shape)}, expected {want_aux}")
    if tuple(stored.final_hidden_state.shape) != (tokens, expect.hidden_size):
        problem(f"row {row}: final state {tuple(stored.final_hidden_state.shape)}, expected {(tokens, expect.hidden_size)}")
    if stored.loss_mask is not None and stored.loss_mask.shape != stored.input_ids.shape:
        problem(f"row {row}: loss_mask {tuple(stored.loss_mask.shape)} does not match input_ids")
    for name, tensor in (("aux", stored.aux_hidden_states), ("final", stored.final_hidden_state)):
        if expect.dtype and str(tensor.dtype).removeprefix("torch.") != expect.dtype:
            problem(f"row {row}: {name} dtype {tensor.dtype}, expected {expect.dtype}")
        if not all_finite(tensor):
            problem(f"row {row}: {name} holds NaN or infinite values")
    _verify_scales(row, stored.hidden_states_scales, tokens, expect, problem)
    report.samples += 1
    report.tokens += tokens


def _verify_scales(row: int, scales: torch.Tensor | None, tokens: int, expect: _Expect, problem: Callable[[str], None]) -> None:
    """An FP8 sample's per-token scales: float32 [T, 1, 1], finite and positive (a zero or NaN scale
    turns the token's states into zeros or NaN in the trainer)."""
    if expect.dtype != FP8_STORAGE:
        if scales is not None:
            problem(f"row {row}: holds hidden_states_scales but the output stores {expect.dtype}; {_REDO}")
        return
    if scales is None:
        problem(f"row {row}: FP8 states without hidden_states_scales; {_REDO}")
        return
    if tuple(scales.shape) != (tokens, 1, 1) or scales.dtype != torch.float32:
        problem(
            f"row {row}: hidden_states_scales {scales.dtype} {tuple(scales.shape)}, expected float32 {(tokens, 1, 1)}; {_REDO}"
        )
        return
    bad = ~(torch.isfinite(scales) & (scales > 0))
    if bool(bad.any()):
        first = int(bad.reshape(-1).nonzero()[0])
        problem(
            f"row {row}: {int(bad.sum())} hidden_states_scales not finite and positive (token {first}: "
            f"{float(scales.reshape(-1)[first])}); {_REDO}"
        )


def _verify_totals(config: DataConfig | None, samples: dict[int, dict[str, Any]], report: VerifyReport) -> None:
    if config is None:
        return
    problem = report.problems.append
    if report.samples != config.total_samples:
        problem(f"{report.samples} samples readable, data_config.json says total_samples {config.total_samples}")
    if report.tokens != config.total_tokens:
        problem(f"{report.tokens} tokens read, data_config.json says total_tokens {config.total_tokens}")
    truncated = sum(1 for r in samples.values() if r.get("original_length", 0) > r.get("num_tokens", 0))
    if truncated != config.truncated_samples:
        problem(f"{truncated} truncated samples in samples.jsonl, data_config.json says {config.truncated_samples}")
