"""``hsextract merge SHARD_OUT... --into OUT``: the shards of one dataset as one trainer-ready output.

Sample files are hard-linked into ``OUT`` where the filesystem allows it (no bytes copied; a shard
that is later re-extracted replaces its files under new inodes, so the merged copy stays intact) and
copied otherwise. ``samples.jsonl`` and ``errors.jsonl`` hold every shard's lines sorted by row; what spans
all samples is the format's to merge (:meth:`~hsextract.output.formats.base.OutputFormat.merge_index`:
for speculators ``OUT/data`` is one Arrow dataset whose index i is row i, every written row taken from
the shard that wrote it). ``data_config.json`` carries the shards' shared fields, their
totals summed, and ``merged_from``: each shard's path, index, totals and timestamps.

Nothing is written before every check of :mod:`hsextract.output.merge_plan` passes. Every file is
written under a temp name and ``os.replace``d; ``data_config.json`` comes last, so an interrupted
merge leaves an output that ``hsextract verify`` rejects, and the same command completes it (files
already in place are kept: the same file, or one of the recorded size and checksum). Copies are synced
before their rename and every folder names were made in before the records are written (``durable``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes, replace_synced, sweep_temp_files, temp_path
from hsextract.durable.sync import sync_dir, sync_dirs
from hsextract.errors import MergeError
from hsextract.output.checksum import file_checksum
from hsextract.output.data_config import DATA_CONFIG_FILE, read_data_config, write_data_config
from hsextract.output.formats import open_format
from hsextract.output.formats.base import OutputFormat
from hsextract.output.manifest import ERRORS_FILE, SAMPLES_FILE, read_jsonl, write_jsonl
from hsextract.output.merge_plan import MergePlan, ShardOutput, build_plan, merged_data_config, provenance_of
from hsextract.paths import check_creatable, make_directory

log = logging.getLogger(__name__)

#: present while a merge is writing OUT; lets a rerun recognise (and finish) its own half-done output
MERGE_MARKER = ".hsextract-merge-in-progress"
#: link(2) errors that mean "this filesystem (pair) cannot hard-link": copy instead
_NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


@dataclass
class MergeSummary:
    into: Path
    shards: int
    samples: int
    tokens: int
    bad_input: int
    linked: int
    copied: int
    already_present: int


def _read_records(path: Path) -> list[dict[str, Any]]:
    """A shard's ``samples.jsonl`` or ``errors.jsonl`` (the manifest's reader); MergeError at its first torn line."""
    content = read_jsonl(path)
    if content.torn_lines:
        raise MergeError(
            f"{path} line {content.torn_lines[0]} is torn or not a row record (the shard's run was killed, or it is no "
            "hsextract output): finish that shard with hsextract extract (same command; it resumes and rewrites the "
            "file) before merging"
        )
    return content.records


def read_shard(path: Path) -> ShardOutput:
    path = Path(path).resolve()
    if not path.is_dir():
        raise MergeError(f"shard output {path} is not a directory; pass each shard's --output directory")
    config = read_data_config(path)
    if config is None:
        raise MergeError(
            f"{path} has no {DATA_CONFIG_FILE}: it is not an hsextract output, or its run never ended; "
            "rerun its hsextract extract command (it resumes) and merge again"
        )
    return ShardOutput(path, config, _read_records(path / SAMPLES_FILE), _read_records(path / ERRORS_FILE))


def _check_target(into: Path, shards: Sequence[ShardOutput]) -> None:
    for shard in shards:
        if into == shard.path or shard.path in into.parents or into in shard.path.parents:
            raise MergeError(f"--into {into} overlaps shard output {shard.path}; choose a directory outside every shard")
    if into.exists() and not into.is_dir():
        raise MergeError(f"--into {into} exists and is not a directory; choose another --into")
    check_creatable(into, "merge target", "--into")
    if not into.exists() or not any(into.iterdir()) or (into / MERGE_MARKER).exists():
        return
    existing = read_data_config(into)
    if existing is None or existing.merged_from is None:
        raise MergeError(
            f"--into {into} is not empty and holds no merge (no {MERGE_MARKER}, no merged {DATA_CONFIG_FILE}); "
            "choose an empty or new directory"
        )


class _Placer:
    """Hard link, else copy, one file at a time under a temp name; remembers when links fail."""

    def __init__(self, copy: bool) -> None:
        self.can_link = not copy
        self.counts = {"linked": 0, "copied": 0, "present": 0}
        self.folders: set[Path] = set()  # where names were made: synced before the merged records are written

    def place(self, src: Path, dst: Path, checksum: str | None) -> None:
        if dst.exists():
            try:
                have, want = dst.stat(), src.stat()
                # the same file: a link of it, or a copy with its size and modification time (copy2, tar and rsync
                # keep it) whose bytes have the recorded checksum (a power loss can keep a copy's size and time but
                # not its data); a shard re-extracted since has new files, which replace the old ones here
                same_copy = (have.st_size, int(have.st_mtime)) == (want.st_size, int(want.st_mtime))
                if os.path.samefile(src, dst) or (same_copy and checksum is not None and file_checksum(dst) == checksum):
                    self.counts["present"] += 1
                    return
            except FileNotFoundError:
                pass
        self.folders.update((dst.parent, dst.parent.parent))
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(dst)
        if self.can_link:
            try:
                os.link(src, tmp)
            except OSError as exc:
                if exc.errno not in _NO_LINK_ERRNOS:
                    raise
                log.info("cannot hard-link %s into %s (%s): copying the files instead", src, dst.parent, exc.strerror)
                self.can_link = False
            else:
                os.replace(tmp, dst)
                self.counts["linked"] += 1
                return
        try:
            shutil.copy2(src, tmp)
            replace_synced(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.counts["copied"] += 1


def _place_samples(plan: MergePlan, fmt: OutputFormat, into: Path, placer: _Placer) -> list[dict[str, Any]]:
    records = []
    for shard in plan.shards:
        shard_fmt = open_format(fmt.name, shard.path)
        for record in shard.samples:
            row = int(record["row"])
            src = shard_fmt.sample_path(row)
            if record.get("file") != shard_fmt.relative(row) or not src.is_file():
                raise MergeError(
                    f"{shard.label}: row {row} is listed as {record.get('file')!r} but {src} is missing; "
                    f"repair the shard first: {shard.finish_command()}"
                )
            placer.place(src, fmt.sample_path(row), record.get("checksum"))
            records.append(record)
            done = sum(placer.counts.values())
            if done % 10000 == 0:
                log.info("merge: %d sample files in place", done)
    return sorted(records, key=lambda r: int(r["row"]))


def _remove_strays(fmt: OutputFormat, into: Path, rows: set[int]) -> int:
    """Sample files of an earlier merge with other shards: not part of this output."""
    wanted = {fmt.sample_path(row) for row in rows}
    removed = 0
    for path in list(fmt.sample_files()):
        if path.is_file() and path not in wanted:
            path.unlink()
            removed += 1
    return removed


def merge_outputs(shard_dirs: Sequence[Path], into: Path, copy: bool = False) -> MergeSummary:
    """Check the shards, then build (or finish building) the merged output in ``into``."""
    shards = [read_shard(Path(d)) for d in shard_dirs]
    plan = build_plan(shards)
    into = Path(into).resolve()
    _check_target(into, plan.shards)
    fmt_name = plan.shards[0].config.format
    if fmt_name is None:
        raise MergeError(
            f"{plan.shards[0].label} records no format in its {DATA_CONFIG_FILE}; rerun its extraction to rewrite it"
        )
    log.info(
        "merging %d shards (%d rows: %d written, %d bad input) of format %s into %s",
        len(plan.shards),
        plan.total_rows,
        len(plan.owner),
        len(plan.bad_rows),
        fmt_name,
        into,
    )
    make_directory(into, "merge target", "--into")
    atomic_write_bytes(into / MERGE_MARKER, (json.dumps([str(s.path) for s in plan.shards]) + "\n").encode())
    (into / DATA_CONFIG_FILE).unlink(missing_ok=True)  # until the end, the output is not complete
    sweep_temp_files(into)
    fmt = open_format(fmt_name, into)
    placer = _Placer(copy)
    samples = _place_samples(plan, fmt, into, placer)
    sync_dirs(placer.folders)  # every placed name on the disk before the records that count them
    removed = _remove_strays(fmt, into, set(plan.owner))
    if removed:
        log.info("removed %d sample files of an earlier merge that this one does not hold", removed)
    fmt.merge_index(plan)
    errors = sorted(
        (e for shard in plan.shards for e in shard.errors if int(e["row"]) in plan.bad_rows),
        key=lambda e: int(e["row"]),
    )
    write_jsonl(into / SAMPLES_FILE, samples)
    write_jsonl(into / ERRORS_FILE, errors)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = merged_data_config(plan, [provenance_of(s) for s in plan.shards], now)
    config.merge_files = {"hard_linked": placer.counts["linked"], "copied": placer.counts["copied"]}
    write_data_config(into, config)
    (into / MERGE_MARKER).unlink()
    sync_dir(into)
    return MergeSummary(
        into=into,
        shards=len(plan.shards),
        samples=len(samples),
        tokens=config.total_tokens,
        bad_input=len(errors),
        linked=placer.counts["linked"],
        copied=placer.counts["copied"],
        already_present=placer.counts["present"],
    )
