"""What ``hsextract merge`` checks before it writes anything: the pure part of a merge.

The shards of one dataset (``--shard-index I --num-shards N``) merge into one output when they
agree on everything that shapes the data (model, layers, format, max_seq_len, sizes, dtype, and the
dataset's fingerprint where the outputs record one), when every index 0..N-1 is given exactly once,
when no row is held by two shards, and when each shard settled every row of its slice (written, or
recorded as bad input). Anything else is refused with the shard's path and the command that fixes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.contract.states import ErrorKind, RunStatus
from hsextract.errors import MergeError
from hsextract.output.data_config import DataConfig, loss_mask_source

#: data_config.json keys (dotted: nested) every shard must hold the same value for
AGREEING_KEYS = (
    "format",
    "data_format_version",
    "aux_layer_ids",
    "layer_ids",
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "dtype",
    "max_seq_len",
    "final_norm_applied",
    "model.path",
    "num_shards",
)
#: compared only when every shard records them (older outputs do not)
AGREEING_WHEN_PRESENT = (
    "dataset_fingerprint",
    "dataset.fingerprint",
    "model.fingerprint",
    "identity.dataset.fingerprint",
    "model.family",
    "computed_dtype",
    "serving",
    "dataset_preparation",
)
#: data_config.json totals that the merged output sums
SUMMED_TOTALS = (
    "total_samples",
    "total_tokens",
    "total_bytes",
    "truncated_samples",
    "truncated_tokens",
    "samples_without_loss_mask",
    "bad_input_samples",
    "failed_samples",
    "rows_in_shard",
)
_MISSING = object()


@dataclass
class ShardOutput:
    """One shard's output directory as read from disk: its data_config.json and manifests."""

    path: Path
    config: DataConfig
    samples: list[dict[str, Any]]  # samples.jsonl records, each with "row" and "file"
    errors: list[dict[str, Any]]  # errors.jsonl records, each with "row" and "kind"

    @property
    def shard_index(self) -> int:
        return self.config.shard_index

    @property
    def num_shards(self) -> int:
        return self.config.num_shards

    @property
    def recorded(self) -> dict[str, Any]:
        """data_config.json's keys as the shard's file holds them (an older output's absent keys absent)."""
        return self.config.to_json()

    @property
    def label(self) -> str:
        return f"shard {self.shard_index}/{self.num_shards} ({self.path})"

    def finish_command(self) -> str:
        dataset = self.config.dataset or "DATASET"
        return (
            f"hsextract extract --dataset {dataset} --output {self.path} --shard-index {self.shard_index} "
            f"--num-shards {self.num_shards} (same server and settings; it resumes)"
        )


@dataclass
class MergePlan:
    """The checked merge: shards by index, and which shard holds each written row."""

    shards: list[ShardOutput]  # sorted by shard index
    owner: dict[int, ShardOutput] = field(default_factory=dict)  # written row -> its shard
    bad_rows: dict[int, ShardOutput] = field(default_factory=dict)  # bad-input row -> its shard
    total_rows: int = 0

    @property
    def last_written_row(self) -> int:
        return max(self.owner, default=-1)


def lookup(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def rows_of_slice(total_rows: int, shard_index: int, num_shards: int) -> int:
    """How many of rows 0..total_rows-1 satisfy row % num_shards == shard_index."""
    if shard_index >= total_rows:
        return 0
    return (total_rows - 1 - shard_index) // num_shards + 1


def check_storage(shards: Sequence[ShardOutput]) -> None:
    """One storage per output: FP8 (with scales) and unquantized files never merge into one."""
    first = shards[0]
    for other in shards[1:]:
        if (other.config.dtype == FP8_STORAGE) != (first.config.dtype == FP8_STORAGE):
            raise MergeError(
                f"{other.label} stores {other.config.dtype} states but {first.label} stores {first.config.dtype}: a "
                "trainer reads one storage per output (FP8 needs --hidden-states-backend fp8, the other must not have "
                "it), so FP8 and unquantized shards never merge. Re-extract the odd shard with the others' --storage, "
                "or merge each storage separately; nothing was written"
            )


def check_agreement(shards: Sequence[ShardOutput]) -> None:
    check_storage(shards)
    first = shards[0]
    for key in AGREEING_KEYS:
        want = lookup(first.recorded, key)
        for other in shards[1:]:
            got = lookup(other.recorded, key)
            if got != want:
                raise MergeError(
                    f"{other.label} has {key}={_show(got)} but {first.label} has {key}={_show(want)}: shards of "
                    "one merge must come from one model, layer set, format and max_seq_len; re-extract that shard "
                    "with the settings of the others, or merge it separately"
                )
    for key in AGREEING_WHEN_PRESENT:
        values = [lookup(s.recorded, key) for s in shards]
        if any(v is _MISSING for v in values):
            continue
        for other, got in zip(shards[1:], values[1:], strict=True):
            if got != values[0]:
                raise MergeError(
                    f"{other.label} was extracted from another dataset ({key} {_show(got)}, {first.label} has "
                    f"{_show(values[0])}): the dataset changed between the shards' runs; re-extract that shard "
                    "from the same dataset file as the others"
                )


def _show(value: Any) -> str:
    return "(absent)" if value is _MISSING else repr(value)


def check_coverage(shards: Sequence[ShardOutput]) -> list[ShardOutput]:
    """Every index 0..N-1 exactly once, each shard complete; returns the shards sorted by index."""
    num_shards = shards[0].num_shards
    by_index: dict[int, ShardOutput] = {}
    for shard in shards:
        if shard.shard_index in by_index:
            raise MergeError(
                f"{shard.path} and {by_index[shard.shard_index].path} are both shard {shard.shard_index} of "
                f"{num_shards}: they overlap; pass only one of them (the one that holds the finished run)"
            )
        by_index[shard.shard_index] = shard
    missing = sorted(set(range(num_shards)) - set(by_index))
    if missing:
        raise MergeError(
            f"shard(s) {', '.join(map(str, missing))} of {num_shards} are not given, so their rows would be missing: "
            "pass every shard's output directory (fetch it first when it sits on another host: make merge); "
            "for a lost shard run hsextract extract --shard-index I --num-shards "
            f"{num_shards} on another host into a new output (docs/fleet.md)"
        )
    for shard in by_index.values():
        status = shard.config.status
        if not shard.config.complete:
            failed = shard.config.failed_samples
            raise MergeError(
                f"{shard.label} is {status!r}, not 'complete' ({failed} rows failed): its unfinished rows would be "
                f"missing from the merge; finish it first: {shard.finish_command()}"
            )
    return [by_index[i] for i in range(num_shards)]


def build_plan(shards: Sequence[ShardOutput]) -> MergePlan:
    """Check the shards against each other and assign every row to the one shard that holds it."""
    if not shards:
        raise MergeError("no shard output directories given; pass SHARD_OUT... (one per shard)")
    check_agreement(shards)
    ordered = check_coverage(shards)
    plan = MergePlan(ordered)
    plan.total_rows = sum(s.config.rows_in_shard for s in ordered)
    for shard in ordered:
        expected = rows_of_slice(plan.total_rows, shard.shard_index, shard.num_shards)
        rows_in_shard = shard.config.rows_in_shard
        if rows_in_shard != expected:
            raise MergeError(
                f"{shard.label} planned {rows_in_shard} rows, but a dataset of {plan.total_rows} rows (the shards' sum) "
                f"gives that slice {expected}: the shards read datasets of different lengths; re-extract that shard "
                "from the same dataset file as the others"
            )
        written = Counter(int(r["row"]) for r in shard.samples)
        bad = {int(e["row"]) for e in shard.errors if e.get("kind") == ErrorKind.BAD_INPUT}
        failed = sorted(int(e["row"]) for e in shard.errors if e.get("kind") != ErrorKind.BAD_INPUT)
        twice = sorted(row for row, n in written.items() if n > 1)
        if twice or failed:
            what = f"rows {twice[:5]} listed twice in samples.jsonl" if twice else f"failed rows {failed[:5]}"
            raise MergeError(f"{shard.label} has {what}: finish or repair it first: {shard.finish_command()}")
        for row in sorted(written.keys() | bad):
            if row % shard.num_shards != shard.shard_index:
                raise MergeError(
                    f"{shard.label} holds row {row}, which belongs to shard {row % shard.num_shards}: this output "
                    "was not made with its recorded --shard-index; re-extract it into a new output"
                )
            holder = plan.owner.get(row) or plan.bad_rows.get(row)
            if holder is not None:
                raise MergeError(f"row {row} is held by both {holder.label} and {shard.label}: pass only one of them")
        settled = len(written) + len(bad - written.keys())
        if settled != rows_in_shard or written.keys() & bad:
            raise MergeError(
                f"{shard.label} settled {settled} of its {rows_in_shard} rows (written or bad input): rows would be "
                f"missing; finish it first: {shard.finish_command()}"
            )
        plan.owner.update(dict.fromkeys(written, shard))
        plan.bad_rows.update(dict.fromkeys(bad, shard))
    return plan


def merged_data_config(plan: MergePlan, provenance: list[dict[str, Any]], merged_at: str) -> DataConfig:
    """The merged output's data_config.json: the shards' shared fields, summed totals, provenance."""
    base = plan.shards[0].recorded
    if any("longest_sample_tokens" in s.recorded for s in plan.shards):
        # the trainer settings depend on the longest sample only (the rest agrees): take the longest shard's
        longest = max(plan.shards, key=lambda s: s.config.longest_sample_tokens)
        base["longest_sample_tokens"] = longest.config.longest_sample_tokens
        if longest.config.trainer is not None:
            base["trainer"] = longest.config.trainer
    for key in SUMMED_TOTALS:
        base[key] = sum(int(getattr(s.config, key)) for s in plan.shards)
    counts: Counter[str] = Counter()
    for shard in plan.shards:
        counts.update(shard.config.error_counts)
    base["error_counts"] = dict(sorted(counts.items()))
    base["loss_mask_source"] = loss_mask_source(base["samples_without_loss_mask"], base["total_samples"])
    base.update(
        {
            "shard_index": 0,
            "num_shards": 1,
            "status": RunStatus.COMPLETE.value,
            "created_at": min(s.config.created_at or merged_at for s in plan.shards),
            "updated_at": merged_at,
            "created_unix": min(s.config.created_unix or 0.0 for s in plan.shards),
            "merged_at": merged_at,
            "merged_from": provenance,
        }
    )
    return DataConfig.model_validate(base)


def provenance_of(shard: ShardOutput) -> dict[str, Any]:
    """What the merged data_config.json records about one shard."""
    config = shard.recorded
    entry: dict[str, Any] = {
        "path": str(shard.path),
        "shard_index": shard.shard_index,
        "num_shards": shard.num_shards,
    }
    for key in (*SUMMED_TOTALS, "status", "dataset", "engine", "extractor_version", "created_at", "updated_at"):
        if key in config:
            entry[key] = config[key]
    return entry
