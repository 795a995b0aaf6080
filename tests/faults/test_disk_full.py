"""A filesystem fills up mid-run (another writer takes the space): the run stops cleanly, says so,
leaves no temp files, and the rerun after freeing space completes. Real tmpfs mounts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import run_extraction
from .helpers import assert_same_output, fill, make_rows, run_extract, samples_written, start_extract, wait_for, write_rows

pytestmark = pytest.mark.root  # tmpfs mounts, chown: root only


LEAVE = 32 * 1024  # less than any sample or dump of these rows (40+ tokens x 1 KB)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp-" in p.name]


# auto writes a tmpfs buffered; direct: an O_DIRECT write that finds the disk full fails the same way
@pytest.mark.parametrize("output_io", ["auto", "direct"])
def test_output_disk_full_mid_run(models, start_server, tmpfs, tmp_path: Path, output_io: str) -> None:
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(20, seed=12))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    disk = tmpfs("outfs", 6 << 20)
    output = disk / "out"

    process = start_extract(server.url, dataset, output, "--output-io", output_io)
    wait_for(lambda: samples_written(output) >= 3, what="3 samples", process=process)
    filler = fill(disk, LEAVE)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "STOPPED" in stdout and "DiskFullError" in stderr and "free space there" in stderr
    assert "Traceback" not in stderr and "crashed the worker" not in stderr
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and "DiskFullError" in config["stop_reason"]
    assert config["total_samples"] < 20
    assert not _temp_files(output)

    filler.unlink()
    rerun = run_extract(server.url, dataset, output, "--output-io", output_io)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


@pytest.mark.parametrize(
    ("extra", "leave"),
    [
        (("--shm-high-water", "1.0"), LEAVE),  # submits anyway: the server's dump write fails with ENOSPC
        # Nothing left: neither the dump nor its error marker can be written. The server's answer says why; before,
        # it answered 200 and the row waited dump_timeout_s (300 s) for a dump that never came (a package-suite
        # run hit it with LEAVE, when the space left went to another write first)
        (("--shm-high-water", "1.0"), 0),
        (("--shm-wait-timeout-s", "2"), LEAVE),  # above the high-water mark with nothing in flight: gives up
    ],
    ids=["dump-write-fails", "marker-write-fails-too", "stays-above-high-water"],
)
def test_dump_filesystem_full_mid_run(
    extra: tuple[str, str], leave: int, models, start_server, tmpfs, tmp_path: Path
) -> None:
    shm = tmpfs("shm", 1 << 20)
    dumps = shm / "dumps"
    server = start_server(models["main"], dump_dir=dumps)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(20, seed=13))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    output = tmp_path / "out"

    process = start_extract(server.url, dataset, output, *extra)
    wait_for(lambda: samples_written(output) >= 3, what="3 samples", process=process)
    filler = fill(shm, leave)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "DiskFullError" in stderr and str(dumps) in stderr
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and "DiskFullError" in config["stop_reason"]
    errors = (output / "errors.jsonl").read_text()
    assert errors == "", f"rows were recorded as failed: {errors}"
    assert list(dumps.iterdir()) == [], "dumps or temp files were left in the dump dir"

    filler.unlink()
    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_output_disk_full_blames_the_local_path_not_the_server(fmt: str, models, start_server, tmpfs, tmp_path: Path) -> None:
    """Issue 39, item 12: the output filesystem fills up completely (not even data_config.json fits). The last
    line names the output's path and the fix, never the server; the summary does not point at a data_config.json
    that was not written."""
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(20, seed=14))
    disk = tmpfs("outfs", 6 << 20)
    output = disk / "out"

    process = start_extract(server.url, dataset, output, "--format", fmt)
    wait_for(lambda: samples_written(output) >= 3, what="3 samples", process=process)
    filler = fill(disk, 0)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert "DiskFullError" in last and str(output) in last and "free space there" in last, last
    assert "ServerError" not in stderr and "internal error" not in stderr and "Traceback" not in stderr, stderr
    assert not (output / "data_config.json").exists()
    assert f"{output}/data_config.json" not in stdout, stdout
    assert "data_config.json could not be written" in stdout, stdout

    filler.unlink()
    rerun = run_extract(server.url, dataset, output, "--format", fmt)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads((output / "data_config.json").read_text())["status"] == "complete"
