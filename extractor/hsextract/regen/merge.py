"""``hsextract merge-regenerated``: the shards of one regeneration (``--shard-index I --num-shards N``)
joined into one output, in input order.

Each shard is a complete regeneration output: OUT (JSONL or Parquet) and ``OUT.journal/summary.json``.
Before anything is written the shards must agree, or :class:`~hsextract.errors.MergeError` names the
shard and the setting:

- every shard is complete (its ``summary.json`` exists; else: rerun ``hsextract regenerate`` there);
- the same identity but for the shard (model and tokenizer fingerprints, template, sampling, turns,
  reasoning, the input's fingerprint and row count), and the same ``num_shards``, which is the number of
  shards given; each index once;
- every shard's counts add up, and together they cover every input row once.

The merged OUT is the whole input's regeneration as one unsharded run would have written it: its ok rows
in input order (by ``regen.source_row``), written to a temp name and moved into place; beside it
``INTO.journal/`` gets ``errors.jsonl`` (every shard's, in input order) and ``summary.json`` (the counts
summed, the identity of the whole input, ``merged_from``), so ``hsextract pipeline`` sees a complete
regenerate step. A rerun writes the same files again.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes
from hsextract.errors import MergeError
from hsextract.regen.config import shard_rows
from hsextract.regen.conversation import META_KEY
from hsextract.regen.journal import ERRORS_FILE, SUMMARY_FILE
from hsextract.regen.writer import read_summary, write_rows, write_summary

log = logging.getLogger(__name__)

#: identity keys that may differ between shards (the shard itself; where the files lay on each host)
_PER_SHARD = ("shard_index", "model_path", "input_path")
#: the counts summed over the shards
_SUMMED = ("rows_in", "ok", "failed", "skipped", "pending", "retryable", "turns_regenerated", "truncated_turns",
           "generated_tokens")


@dataclass(frozen=True)
class Shard:
    output: Path
    summary: dict[str, Any]

    @property
    def journal(self) -> Path:
        return self.output.with_name(self.output.name + ".journal")

    @property
    def identity(self) -> dict[str, Any]:
        return dict(self.summary.get("identity") or {})

    @property
    def index(self) -> int:
        return int(self.identity.get("shard_index", 0))


@dataclass(frozen=True)
class RegenMergeSummary:
    into: Path
    shards: int
    rows_in: int
    ok: int
    failed: int
    skipped: int


def _open_shard(output: Path) -> Shard:
    output = Path(output)
    journal = output.with_name(output.name + ".journal")
    summary = read_summary(journal)
    if summary is None or not output.is_file():
        raise MergeError(
            f"{output} is no complete regeneration output ({journal / SUMMARY_FILE} or the file itself is missing); "
            "rerun hsextract regenerate for that shard until it says COMPLETE"
        )
    return Shard(output, summary)


def _check(shards: Sequence[Shard]) -> None:
    first = shards[0]
    expected = {k: v for k, v in first.identity.items() if k not in _PER_SHARD}
    num_shards = int(expected.get("num_shards", 1))
    if num_shards != len(shards):
        raise MergeError(f"{first.output} is shard {first.index} of {num_shards}, but {len(shards)} shard(s) were given; "
                         f"give all {num_shards}")
    seen: dict[int, Path] = {}
    for shard in shards:
        identity = {k: v for k, v in shard.identity.items() if k not in _PER_SHARD}
        differ = sorted(k for k in set(identity) | set(expected) if identity.get(k) != expected.get(k))
        if differ:
            detail = "; ".join(f"{k}: {expected.get(k)!r} in {first.output}, {identity.get(k)!r} here" for k in differ)
            raise MergeError(f"{shard.output} was regenerated otherwise than {first.output} ({detail}); every shard must "
                             "be made with the same model, template, sampling and input")
        if shard.index in seen:
            raise MergeError(f"{seen[shard.index]} and {shard.output} are both shard {shard.index}; give each shard once")
        seen[shard.index] = shard.output
        counts = shard.summary.get("counts") or {}
        want = len(shard_rows(shard.index, num_shards, int(expected["input_rows"])))
        settled = sum(int(counts.get(k, 0)) for k in ("ok", "failed", "skipped"))
        if int(counts.get("rows_in", -1)) != want or settled != want or counts.get("pending") or counts.get("retryable"):
            raise MergeError(f"{shard.output}: shard {shard.index} settled {settled} of its {want} rows ({counts}); "
                             "rerun hsextract regenerate for it")


def _read_rows(output: Path) -> Iterator[dict[str, Any]]:
    if output.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(output).iter_batches():
            yield from batch.to_pylist()
        return
    with open(output, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    raise MergeError(f"{output}: line {number} is not JSON; regenerate that shard again") from None


def _source_row(row: dict[str, Any], output: Path) -> int:
    meta = row.get(META_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("source_row"), int):
        raise MergeError(f"{output}: a row without {META_KEY}.source_row (made by an older hsextract); regenerate that "
                         "shard again with this one")
    return int(meta["source_row"])


def _in_input_order(shards: Sequence[Shard]) -> Iterator[dict[str, Any]]:
    streams = [((_source_row(row, s.output), i, row) for row in _read_rows(s.output)) for i, s in enumerate(shards)]
    last = -1
    for source_row, _, row in heapq.merge(*streams, key=lambda item: (item[0], item[1])):
        if source_row <= last:
            raise MergeError(f"input row {source_row} is in more than one shard, or a shard is out of order; regenerate "
                             "the shards again")
        last = source_row
        yield row


def _errors(shards: Sequence[Shard]) -> list[dict[str, Any]]:
    records = []
    for shard in shards:
        path = shard.journal / ERRORS_FILE
        if path.is_file():
            records += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(records, key=lambda record: int(record["row"]))


def merge_regenerated(outputs: Sequence[Path], into: Path) -> RegenMergeSummary:
    """Join the shards' outputs into ``into`` (input order) and its journal's summary; MergeError first if
    they do not make one whole regeneration."""
    if not outputs:
        raise MergeError("no shard outputs given; pass each shard's regenerated file")
    into = Path(into)
    if into.suffix not in (".jsonl", ".parquet"):
        raise MergeError(f"--into {into} must end in .jsonl or .parquet")
    shards = sorted((_open_shard(output) for output in outputs), key=lambda s: s.index)
    _check(shards)
    written = write_rows(into, _in_input_order(shards))
    counts: dict[str, Any] = {k: sum(int((s.summary.get("counts") or {}).get(k, 0)) for s in shards) for k in _SUMMED}
    for key in ("failed_by_reason", "skipped_by_reason"):
        merged: dict[str, int] = {}
        for shard in shards:
            for reason, n in ((shard.summary.get("counts") or {}).get(key) or {}).items():
                merged[reason] = merged.get(reason, 0) + int(n)
        counts[key] = dict(sorted(merged.items()))
    if written != counts["ok"]:
        raise MergeError(f"the shards' files hold {written} rows but their summaries count {counts['ok']} ok; "
                         "regenerate the shards again")
    journal = into.with_name(into.name + ".journal")
    journal.mkdir(parents=True, exist_ok=True)
    errors = _errors(shards)
    atomic_write_bytes(journal / ERRORS_FILE,
                       "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in errors).encode())
    whole = {**shards[0].identity, "shard_index": 0, "num_shards": 1}
    summary = {
        "counts": counts,
        "identity": whole,
        "server": shards[0].summary.get("server"),
        "output": str(into),
        "hsextract_version": shards[0].summary.get("hsextract_version"),
        "seconds": max(float(s.summary.get("seconds", 0.0)) for s in shards),
        "merged_from": [{"shard_index": s.index, "output": str(s.output), "counts": s.summary.get("counts"),
                         "server": s.summary.get("server")} for s in shards],
    }
    write_summary(journal, summary)
    log.info("merged %d shards into %s: %d rows", len(shards), into, written)
    return RegenMergeSummary(into, len(shards), counts["rows_in"], counts["ok"], counts["failed"], counts["skipped"])
