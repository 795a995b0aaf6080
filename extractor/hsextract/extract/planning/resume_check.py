"""What a resume trusts: only samples it has verified.

A sample in ``samples.jsonl`` counts as done when its dataset row still has the content hash it
was made from, its file is where the format puts that row, and the file has the recorded size and
(with ``resume_check: checksum``, the default) checksum. Anything else is forgotten and redone:
a row edited or inserted in the dataset, a truncated or altered file, a missing one. Rows that
left the dataset (it shrank) lose their sample files. Bad-input records are kept only for the
row content they were made from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.durable.atomic import remove_quietly
from hsextract.extract.planning.scan import DatasetScan
from hsextract.output.checksum import END_BYTES, check_sample_file
from hsextract.output.formats.base import OutputFormat
from hsextract.output.manifest import Manifest, WrittenSample

log = logging.getLogger(__name__)

_WORKERS = 4


@dataclass
class ResumeCheck:
    verified: int = 0
    changed_rows: list[int] = field(default_factory=list)
    vanished_rows: list[int] = field(default_factory=list)
    damaged: list[tuple[int, str, str]] = field(default_factory=list)  # row, file, what is wrong

    def log_summary(self) -> None:
        if self.verified or self.changed_rows or self.damaged or self.vanished_rows:
            log.info(
                "resume: %d samples verified; %d rows changed in the dataset, %d damaged or missing files, %d rows "
                "no longer in the dataset: redone or removed",
                self.verified,
                len(self.changed_rows),
                len(self.damaged),
                len(self.vanished_rows),
            )
        for row, file, problem in self.damaged[:20]:
            log.warning("row %d: %s %s: redoing it", row, file, problem)
        if self.changed_rows:
            shown = ", ".join(map(str, self.changed_rows[:20])) + (" ..." if len(self.changed_rows) > 20 else "")
            log.warning("rows whose content changed since they were extracted, redone: %s", shown)


def check_resume(
    manifest: Manifest,
    scan: DatasetScan,
    fmt: OutputFormat,
    with_checksum: bool,
    check_stop: Callable[[], None] = lambda: None,
) -> ResumeCheck:
    result = ResumeCheck()
    root = Path(manifest.root)
    for row in sorted(set(manifest.written) | set(manifest.errors)):
        current = scan.row_hashes.get(row)
        written = manifest.written.get(row)
        if current is None:
            if written is not None:
                result.vanished_rows.append(row)
                remove_quietly(root / written.file)
            manifest.forget(row)
        elif written is not None and written.row_hash != current:
            result.changed_rows.append(row)
            manifest.forget(row)
        elif written is None and manifest.errors[row].row_hash != current:
            manifest.forget(row)  # bad input of another content: look at the row again
    samples = list(manifest.written.values())

    def problem(sample: WrittenSample) -> str | None:
        if sample.file != fmt.relative(sample.row):
            return f"is not where the {fmt.name} format keeps row {sample.row} ({fmt.relative(sample.row)})"
        return check_sample_file(root / sample.file, sample.bytes, sample.checksum, with_checksum)

    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="hsextract-resume") as pool:
        for sample, wrong in zip(samples, pool.map(problem, samples), strict=True):
            check_stop()
            if wrong is None:
                result.verified += 1
            else:
                result.damaged.append((sample.row, sample.file, wrong))
                manifest.forget(sample.row)
    if not with_checksum and result.verified:
        log.warning(
            "resume: %d samples of earlier runs were trusted on their size and the first and last %d bytes alone "
            "(--resume-check size): `hsextract verify %s` reads them whole", result.verified, END_BYTES, root
        )
    return result
