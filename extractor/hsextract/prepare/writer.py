"""The resumable, atomic writer of a prepared dataset.

While it runs, everything lives in a sibling staging directory ``<OUT>.partial/``:

- ``settings.json``: the settings the rows depend on; a rerun with others is refused;
- ``parts/part-NNNNNN.arrow`` (+ ``.errors.jsonl``): the rows and the bad rows of one chunk of input
  rows, each written under a temporary name, fsynced and renamed;
- ``journal.jsonl``: one fsynced line per finished part (its input rows and counts), appended after
  the part's files are in place. A part is done exactly when its journal line is; a rerun starts
  after the last one, so every input row is written exactly once, whatever moment a run was killed.

At the end the parts are assembled into ``<OUT>.partial/final`` (``datasets`` ``save_to_disk``, the
errors file, ``prepare.json`` last), which is renamed to ``OUT`` in one step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes
from hsextract.durable.lock import OutputLock
from hsextract.durable.sync import sync_dir, sync_handle, sync_tree
from hsextract.errors import ConfigError
from hsextract.prepare.provenance import ERRORS_FILE, PROVENANCE_FILE, Provenance, Settings, write_provenance
from hsextract.prepare.rows import Outcome

log = logging.getLogger(__name__)

COLUMNS = ("input_ids", "loss_mask", "source_row", "turn")


@dataclass
class PartRecord:
    """One finished part: its input rows [first_row, end_row) and what they gave."""

    part: int
    first_row: int
    end_row: int
    rows_out: int = 0
    conversations_used: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    truncated: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("source_row", pa.int64()),
            ("turn", pa.int32()),
        ]
    )


def _damage(output: Path) -> str | None:
    """What a power loss left wrong in a finished prepared dataset (an older hsextract did not sync it): an
    empty or torn prepare.json, an empty data file; None when it looks whole."""
    try:
        json.loads((output / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return f"its {PROVENANCE_FILE} is empty or torn"
    empty = sorted(p.name for p in output.glob("*.arrow") if p.stat().st_size == 0)
    return f"its data files {', '.join(empty)} are empty" if empty else None


class PreparedWriter:
    def __init__(self, output: Path, settings: Settings, progress: bool = True) -> None:
        self.output = Path(output)
        self.settings = settings
        self.progress = progress  # False: no bar, datasets' "Saving the dataset" included
        self.staging = self.output.with_name(self.output.name + ".partial")
        self.parts_dir = self.staging / "parts"
        self._lock: OutputLock | None = None

    # -- state -------------------------------------------------------------------------------------------------
    def check_output(self) -> bool:
        """True when OUT is already a complete prepared dataset of these settings; ConfigError when it is in the way."""
        if not self.output.exists():
            return False
        if (self.output / PROVENANCE_FILE).is_file():
            from hsextract.prepare.provenance import read_provenance

            damage = _damage(self.output)
            if damage:  # ours (it has prepare.json), cut by a power loss: prepared again
                log.warning("%s: %s (a power loss right after prepare finished?); it is prepared again", self.output, damage)
                shutil.rmtree(self.output)
                return False
            done = read_provenance(self.output)
            if done is not None and done.settings == self.settings:
                shutil.rmtree(self.staging, ignore_errors=True)  # left by a kill right after the final rename
                return True
            raise ConfigError(
                f"--output {self.output} is a prepared dataset made with other settings (see its {PROVENANCE_FILE}); "
                "choose another --output, or remove it to prepare again"
            )
        if not self.output.is_dir() or any(self.output.iterdir()):
            raise ConfigError(f"--output {self.output} exists and is not a prepared dataset; choose a new directory")
        return False

    @property
    def is_open(self) -> bool:
        return self._lock is not None

    def started(self) -> bool:
        return (self.staging / "settings.json").is_file()

    def open(self) -> list[PartRecord]:
        """Create or reopen the staging directory (locked); the parts finished so far."""
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        lock = OutputLock(self.staging, command="prepare", name="lock")
        lock.acquire()  # held until finish() or close()
        self._lock = lock
        settings_path = self.staging / "settings.json"
        if settings_path.is_file():
            recorded = json.loads(settings_path.read_text(encoding="utf-8"))
            if recorded != asdict(self.settings):
                changed = sorted(k for k in recorded.keys() | asdict(self.settings).keys()
                                 if recorded.get(k) != asdict(self.settings).get(k))
                raise ConfigError(
                    f"{self.staging} holds an interrupted prepare with other settings ({', '.join(changed)} differ); "
                    f"rerun with the same options to resume it, or remove {self.staging} to start over"
                )
        else:
            atomic_write_bytes(settings_path, json.dumps(asdict(self.settings), indent=2).encode())
        return self._read_journal()

    def _read_journal(self) -> list[PartRecord]:
        path = self.staging / "journal.jsonl"
        if not path.is_file():
            return []
        records: list[PartRecord] = []
        good = 0
        with open(path, "rb") as handle:
            for line in handle:
                try:
                    record = PartRecord(**json.loads(line))
                except (ValueError, TypeError):
                    break  # a line torn by a kill: that part is not done
                if record.part != len(records) or not (self.parts_dir / f"part-{record.part:06d}.arrow").is_file():
                    break
                records.append(record)
                good += len(line)
        if good != path.stat().st_size:
            with open(path, "r+b") as handle:
                handle.truncate(good)
        return records

    # -- writing -----------------------------------------------------------------------------------------------
    def write_part(self, part: int, first_row: int, end_row: int, outcomes: list[Outcome]) -> PartRecord:
        import pyarrow as pa

        record = PartRecord(part, first_row, end_row)
        dropped: Counter[str] = Counter()
        notes: Counter[str] = Counter()
        columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
        errors = []
        for outcome in outcomes:
            notes.update(outcome.notes)
            if outcome.error is not None:
                dropped[outcome.error.reason] += 1
                errors.append({"row": outcome.source_row, "reason": outcome.error.reason, "message": outcome.error.message})
                continue
            record.conversations_used += 1
            for row in outcome.rows:
                columns["input_ids"].append(row.input_ids)
                columns["loss_mask"].append(row.loss_mask)
                columns["source_row"].append(outcome.source_row)
                columns["turn"].append(row.turn)
                record.tokens += len(row.input_ids)
                record.supervised_tokens += sum(row.loss_mask)
                record.truncated += row.truncated
        record.rows_out = len(columns["turn"])
        record.dropped, record.notes = dict(dropped), dict(notes)
        base = self.parts_dir / f"part-{part:06d}"
        table = pa.table(columns, schema=_schema())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as ipc:
            ipc.write_table(table)
        atomic_write_bytes(base.with_suffix(".arrow"), sink.getvalue().to_pybytes(), sync_folder=False)
        text = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in errors)
        atomic_write_bytes(base.with_suffix(".errors.jsonl"), text.encode(), sync_folder=False)
        sync_dir(self.parts_dir)  # both names, before the journal line that counts them
        with open(self.staging / "journal.jsonl", "ab") as journal:
            journal.write((json.dumps(asdict(record)) + "\n").encode())
            sync_handle(journal)
        return record

    def finish(self, records: list[PartRecord], provenance: Provenance) -> None:
        """Assemble the parts into OUT in one rename."""
        import datasets
        import pyarrow as pa
        from datasets.table import InMemoryTable

        final = self.staging / "final"
        if final.exists():
            shutil.rmtree(final)
        tables = [
            pa.ipc.open_file(pa.memory_map(str(self.parts_dir / f"part-{r.part:06d}.arrow"))).read_all() for r in records
        ]
        table = pa.concat_tables(tables) if tables else _schema().empty_table()
        features = datasets.Features(
            {
                "input_ids": datasets.Sequence(datasets.Value("int32")),
                "loss_mask": datasets.Sequence(datasets.Value("int8")),
                "source_row": datasets.Value("int64"),
                "turn": datasets.Value("int32"),
            }
        )
        dataset = datasets.Dataset(InMemoryTable(table.cast(features.arrow_schema)))
        with _progress_bars(self.progress):
            dataset.save_to_disk(str(final))
        with open(final / ERRORS_FILE, "wb") as errors:
            for r in records:
                with open(self.parts_dir / f"part-{r.part:06d}.errors.jsonl", "rb") as part_errors:
                    shutil.copyfileobj(part_errors, errors)
            sync_handle(errors)
        write_provenance(final, provenance)
        sync_tree(final)  # save_to_disk's files too: a power loss after the rename left them empty
        if self.output.exists():
            self.output.rmdir()  # checked empty before the run
        os.rename(final, self.output)
        sync_dir(self.output.parent)
        self.close()
        shutil.rmtree(self.staging, ignore_errors=True)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


@contextlib.contextmanager
def _progress_bars(shown: bool) -> Iterator[None]:
    """datasets' own bars (``save_to_disk``'s "Saving the dataset") on or off for the block, then as they were."""
    from datasets.utils import logging as datasets_logging

    enabled = datasets_logging.is_progress_bar_enabled()
    if enabled and not shown:
        datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled and not shown:
            datasets_logging.enable_progress_bar()
