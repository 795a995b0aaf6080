"""``hsextract verify``: re-read a whole output directory and check it against its metadata."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hsextract.contract.atomic import is_temp_name
from hsextract.contract.states import RunStatus
from hsextract.errors import OutputError
from hsextract.extract.data_config import read_data_config
from hsextract.extract.formats import open_format
from hsextract.extract.manifest import ERRORS_FILE, SAMPLES_FILE

log = logging.getLogger(__name__)


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


def _jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verify_output(output: Path, on_sample: Callable[[], None] | None = None) -> VerifyReport:
    output = Path(output)
    report = VerifyReport(output)
    config = read_data_config(output)
    if config is None:
        raise OutputError(f"{output} has no data_config.json; is it an hsextract output directory?")
    problem = report.problems.append
    fmt = open_format(config["format"], output)
    samples = _jsonl(output / SAMPLES_FILE)
    errors = _jsonl(output / ERRORS_FILE)
    report.errors_recorded = len(errors)
    hidden, num_aux = config["hidden_size"], len(config["aux_layer_ids"])
    dtype = config.get("dtype")
    rows_seen: set[int] = set()
    for record in samples:
        row = record["row"]
        rows_seen.add(row)
        try:
            stored = fmt.read_sample(row)
        except Exception as exc:
            problem(f"row {row}: {record['file']} cannot be read: {exc}")
            continue
        tokens = int(stored.input_ids.shape[0])
        if tokens != record["num_tokens"]:
            problem(f"row {row}: {tokens} tokens in the file, {record['num_tokens']} in samples.jsonl")
        if tokens > config["max_seq_len"]:
            problem(f"row {row}: {tokens} tokens exceed max_seq_len {config['max_seq_len']}")
        if tuple(stored.aux_hidden_states.shape) != (tokens, num_aux, hidden):
            problem(f"row {row}: aux states {tuple(stored.aux_hidden_states.shape)}, expected {(tokens, num_aux, hidden)}")
        if tuple(stored.final_hidden_state.shape) != (tokens, hidden):
            problem(f"row {row}: final state {tuple(stored.final_hidden_state.shape)}, expected {(tokens, hidden)}")
        if stored.loss_mask is not None and stored.loss_mask.shape != stored.input_ids.shape:
            problem(f"row {row}: loss_mask {tuple(stored.loss_mask.shape)} does not match input_ids")
        for name, tensor in (("aux", stored.aux_hidden_states), ("final", stored.final_hidden_state)):
            if dtype and str(tensor.dtype).removeprefix("torch.") != dtype:
                problem(f"row {row}: {name} dtype {tensor.dtype}, expected {dtype}")
            if not bool(torch.isfinite(tensor).all()):
                problem(f"row {row}: {name} holds NaN or infinite values")
        report.samples += 1
        report.tokens += tokens
        if on_sample is not None:
            on_sample()
    if report.samples != config["total_samples"]:
        problem(f"{report.samples} samples readable, data_config.json says total_samples {config['total_samples']}")
    if report.tokens != config["total_tokens"]:
        problem(f"{report.tokens} tokens read, data_config.json says total_tokens {config['total_tokens']}")
    truncated = sum(1 for r in samples if r["original_length"] > r["num_tokens"])
    if truncated != config["truncated_samples"]:
        problem(f"{truncated} truncated samples in samples.jsonl, data_config.json says {config['truncated_samples']}")
    overlap = rows_seen & {e["row"] for e in errors}
    if overlap:
        problem(f"rows both written and in errors.jsonl: {sorted(overlap)[:10]}")
    if config.get("status") != RunStatus.COMPLETE:
        problem(f"the run's status is {config.get('status')!r}, not 'complete'; rerun the extraction to finish it")
    strays = [p for p in output.rglob(".*") if is_temp_name(p.name)]
    if strays:
        problem(f"{len(strays)} temporary files left, e.g. {strays[0]}")
    on_disk = {p for p in output.rglob("*") if p.is_file() and p.suffix in (".ckpt", ".safetensors")}
    listed = {fmt.sample_path(r) for r in rows_seen}
    if on_disk - listed:
        problem(f"{len(on_disk - listed)} sample files not listed in samples.jsonl, e.g. {sorted(on_disk - listed)[0]}")
    if config["format"] == "speculators":
        _verify_speculators_dataset(output, rows_seen, fmt, problem)
    return report


def _verify_speculators_dataset(output: Path, rows: set[int], fmt, problem) -> None:  # type: ignore[no-untyped-def]
    import datasets

    try:
        data = datasets.load_from_disk(str(output / "data"))
    except Exception as exc:
        problem(f"data/ cannot be loaded with datasets.load_from_disk: {exc}")
        return
    for row in sorted(rows):
        if row >= len(data):
            problem(f"row {row} is written but data/ has only {len(data)} entries")
            continue
        entry = data[row]
        token_ids = fmt.read_sample(row).input_ids
        if not torch.equal(entry["input_ids"], token_ids) or int(entry["seq_len"]) != token_ids.shape[0]:
            problem(f"row {row}: data/ input_ids or seq_len differ from hs_{row}.safetensors")
