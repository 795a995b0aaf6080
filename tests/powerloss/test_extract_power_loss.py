"""A power cut during and after ``hsextract extract``, on a filesystem that drops what was not synced
(``lossy_fs.py``): mid-run, right after the run ended, and mid-run with the small bookkeeping files written
back before the samples (an order the kernel may choose). Then the same command again: it must end
COMPLETE, pass ``verify`` and equal an uninterrupted run, with nothing asked of the user but the rerun."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..faults.helpers import assert_same_output, kill_after_samples, make_rows, run_extract, start_extract, write_rows
from .helpers import LossyMount

ROWS = 24
#: below every sample file of these rows (tens of KB), above samples.jsonl, identity.json and the like
BOOKKEEPING_BYTES = 8192
FORMATS = {
    "specforge": (),
    # sample files written with O_DIRECT (auto writes FUSE buffered): a direct write is no sync either
    "specforge-direct-io": ("--output-io", "direct"),
    "speculators-fp8": ("--format", "speculators", "--storage", "float8_e4m3fn"),
}


@pytest.mark.parametrize("when", ["mid_run", "after_the_run", "bookkeeping_first"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_same_command_recovers_every_row(  # type: ignore[no-untyped-def]
    models, server_process, lossy: LossyMount, tmp_path: Path, fmt: str, when: str
) -> None:
    server = server_process(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(ROWS, seed=31))
    extra = FORMATS[fmt]
    reference = tmp_path / "reference"
    assert run_extract(server.url, dataset, reference, *extra).returncode == 0
    output = lossy.path / "out"
    if when == "after_the_run":
        done = run_extract(server.url, dataset, output, *extra)
        assert done.returncode == 0, done.stderr
    else:
        kill_after_samples(start_extract(server.url, dataset, output, *extra), output, 8)
        if when == "bookkeeping_first":
            lossy.persist(BOOKKEEPING_BYTES)
    lost = lossy.stats()
    lossy.cut()
    if when == "after_the_run":  # a run that said it was done left all of it on the disk
        assert_same_output(output, reference)
    rerun = run_extract(server.url, dataset, output, *extra)
    assert rerun.returncode == 0, f"after a cut that dropped {lost}: {rerun.stderr[-3000:]}"
    assert "refuses direct I/O" not in rerun.stderr  # the FUSE filesystem takes O_DIRECT: the direct path ran
    assert "COMPLETE" in rerun.stdout
    if when == "after_the_run":
        assert f"written now 0, already done {ROWS}" in rerun.stdout
    assert_same_output(output, reference)
