"""A complete dump to a written sample: read it, check it, write the sample file, free the dump, sync the file.

The same steps run on a row's thread or in a pack process (:mod:`hsextract.extract.pack_processes`). What
each step took is returned (:attr:`Packed.seconds`), not observed here, so that a process without the
run's metrics can run them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.contract.files.dumps import Dump, read_dump, remove_dump
from hsextract.durable.atomic import is_disk_full
from hsextract.durable.sync import sync_file
from hsextract.errors import HsextractError
from hsextract.extract.checks.dump_checks import DumpExpectation, Expectations, check_dump
from hsextract.extract.ledger import disk_full_error
from hsextract.output.checksum import WrittenFile
from hsextract.output.formats.base import OutputFormat
from hsextract.output.sample import Sample


@dataclass(frozen=True)
class PackJob:
    """One row whose dump is complete, and what its dump must be."""

    sample: Sample
    directory: Path
    expect: DumpExpectation


@dataclass
class Packed:
    """A written sample: its file, when its dump was taken up, and each step's seconds (``read``, ``verify``,
    ``pack``, ``sync``: the extractor's stage names)."""

    written: WrittenFile | None = None
    picked_up_after_s: float | None = None  # since the dump's done marker was written
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started


def take_dump(directory: Path, packed: Packed) -> Dump:
    """Read a complete dump, noting how long after its completion it was taken up."""
    with packed.timed("read"):
        dump = read_dump(directory)
    if dump.completed_at is not None:
        packed.picked_up_after_s = max(0.0, time.time() - dump.completed_at)
    return dump


def write_sample_file(fmt: OutputFormat, output: Path, sample: Sample, dump: Dump, directory: Path, packed: Packed) -> None:
    """The sample file written, then its dump removed (before the file's sync: a dump tmpfs sized for a few dumps
    waits on it)."""
    with packed.timed("pack"):
        try:
            packed.written = fmt.write_sample(sample, dump)
        except Exception as exc:  # torch's zip writer wraps the OSError in a RuntimeError, safetensors in a SafetensorError
            if not isinstance(exc, HsextractError) and is_disk_full(exc):
                raise disk_full_error(output, "the output", exc) from exc
            raise
        remove_dump(directory)


def sync_sample_file(fmt: OutputFormat, output: Path, sample: Sample, packed: Packed) -> None:
    """The written sample file on the disk, before the ledger records it (manifest.py syncs its folder and line)."""
    with packed.timed("sync"):
        try:
            sync_file(fmt.sample_path(sample.row))
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(output, "the output", exc) from exc
            raise


def write_and_sync(fmt: OutputFormat, output: Path, sample: Sample, dump: Dump, directory: Path, packed: Packed) -> None:
    """:func:`write_sample_file`, then :func:`sync_sample_file`: a spot-checked row's file, which takes no turn."""
    write_sample_file(fmt, output, sample, dump, directory, packed)
    sync_sample_file(fmt, output, sample, packed)


def read_checked(
    directory: Path, sample: Sample, expectations: Expectations, packed: Packed, *, values: bool = True
) -> Dump:
    """The row's dump, read and checked against what the run expects (:func:`check_dump`; ``values=False``: all but
    the NaN and infinity pass, which a format that checks as it writes makes in ``pack``)."""
    dump = take_dump(directory, packed)
    with packed.timed("verify"):
        check_dump(dump, sample.input_ids, expectations.for_dump(dump), values=values)
    return dump


def pack_row(
    fmt: OutputFormat, output: Path, sample: Sample, directory: Path, expectations: Expectations, *, sync: bool = True
) -> Packed:
    """Every step for a row that is not spot-checked, on whichever thread or process calls it; ``sync=False``: all
    but the file's sync (:func:`sync_sample_file`), which the caller makes."""
    packed = Packed()
    dump = read_checked(directory, sample, expectations, packed, values=not fmt.checks_values_as_written)
    write_sample_file(fmt, output, sample, dump, directory, packed)
    if sync:
        sync_sample_file(fmt, output, sample, packed)
    return packed
