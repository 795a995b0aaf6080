"""A damaged output: verify names each damaged file and the fix (never a traceback), and a rerun
repairs exactly what is damaged."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ..helpers import run_extraction
from .helpers import assert_same_output, make_rows, run_extract, write_rows


def _verify_cli(output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hsextract", "verify", str(output)], capture_output=True, text=True, timeout=120)


def test_truncated_altered_or_missing_samples_are_reported_and_redone(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(8, seed=10))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    output = tmp_path / "out"
    run_extraction(server.url, dataset, output, concurrency=1)
    group = output / "rows_0-2000"
    truncated, altered, missing = group / "data_2.ckpt", group / "data_5.ckpt", group / "data_6.ckpt"
    with open(truncated, "r+b") as handle:
        handle.truncate(truncated.stat().st_size // 2)
    with open(altered, "r+b") as handle:  # same size, other bytes: only the checksum sees it
        handle.seek(altered.stat().st_size - 100)
        handle.write(b"\x00" * 50)
    missing.unlink()

    report = _verify_cli(output)
    assert report.returncode == 1, report.stdout
    assert "Traceback" not in report.stdout + report.stderr
    for path, what in ((truncated, "bytes, samples.jsonl recorded"), (altered, "checksum"), (missing, "is missing")):
        line = next((ln for ln in report.stdout.splitlines() if str(path) in ln), "")
        assert what in line and "rerun `hsextract extract` with the same settings" in line, report.stdout

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert "3 damaged or missing files" in rerun.stderr
    assert "written now 3, already done 5" in rerun.stdout
    assert_same_output(output, reference)


def test_torn_last_line_of_samples_jsonl(models, start_server, tmp_path: Path) -> None:
    """What a crash mid-append leaves (the manifest expects it): verify reports it, a rerun mends it."""
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(6, seed=11))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    output = tmp_path / "out"
    run_extraction(server.url, dataset, output, concurrency=1)
    samples = output / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text("".join(lines[:-1]) + lines[-1][:40])  # the last record torn mid-line

    report = _verify_cli(output)
    assert report.returncode == 1, report.stdout + report.stderr
    assert "Traceback" not in report.stdout + report.stderr
    assert "samples.jsonl line 6 is torn" in report.stdout

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert "written now 1, already done 5" in rerun.stdout
    assert_same_output(output, reference)


def test_a_wrong_or_missing_token_freq_is_reported_and_rewritten(models, start_server, tmp_path: Path) -> None:
    import torch

    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(4, seed=12))
    output = tmp_path / "out"
    run_extraction(server.url, dataset, output, concurrency=1, format="speculators")
    freq_file = output / "data" / "token_freq.pt"
    counts = torch.load(freq_file, weights_only=True)
    assert counts and _verify_cli(output).returncode == 0

    wrong = dict(counts)
    first = next(iter(wrong))
    wrong[first] += 1
    torch.save(wrong, freq_file)
    report = _verify_cli(output)
    assert report.returncode == 1 and "does not count data/'s supervised tokens" in report.stdout, report.stdout
    freq_file.unlink()
    report = _verify_cli(output)
    assert report.returncode == 1 and f"{freq_file} is missing" in report.stdout, report.stdout

    rerun = run_extract(server.url, dataset, output, "--format", "speculators")
    assert rerun.returncode == 0, rerun.stderr
    assert torch.load(freq_file, weights_only=True) == counts
    assert _verify_cli(output).returncode == 0


def test_a_speculators_index_that_disagrees_with_the_files_is_reported(models, start_server, tmp_path: Path) -> None:
    """data/ (what the trainer reads for input_ids and seq_len) against each row's file: an entry that
    differs and rows past data/'s end are named, row by row."""
    import datasets

    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(5, seed=13))
    output = tmp_path / "out"
    run_extraction(server.url, dataset, output, concurrency=1, format="speculators")
    assert _verify_cli(output).returncode == 0
    data = output / "data"
    table = datasets.load_from_disk(str(data)).with_format(None).to_dict()
    table["input_ids"][1] = [*table["input_ids"][1][:-1], table["input_ids"][1][-1] + 1]  # one token of row 1
    table["seq_len"][2] += 1  # row 2's length
    shorter = {key: values[:4] for key, values in table.items()}  # row 4 past the end
    features = datasets.load_from_disk(str(data)).features

    def replace_data(torch_format: bool, drop: str = "") -> None:
        damaged = datasets.Dataset.from_dict(shorter, features=features)
        damaged = damaged.remove_columns([drop]) if drop else damaged
        if torch_format:
            damaged.set_format("torch")
        shutil.rmtree(tmp_path / "damaged", ignore_errors=True)
        damaged.save_to_disk(str(tmp_path / "damaged"))
        shutil.rmtree(data)
        (tmp_path / "damaged").rename(data)

    replace_data(torch_format=True)
    report = _verify_cli(output)
    assert report.returncode == 1 and "Traceback" not in report.stdout + report.stderr, report.stdout + report.stderr
    for row in (1, 2):
        assert f"row {row}: data/ input_ids or seq_len differ from hs_{row}.safetensors" in report.stdout, report.stdout
    assert "row 0: data/" not in report.stdout and "row 3: data/" not in report.stdout
    assert "row 4 is written but data/ has only 4 entries" in report.stdout, report.stdout
    assert "not torch" not in report.stdout

    replace_data(torch_format=False)  # what the trainer cannot read: named, with the fix, never a traceback
    report = _verify_cli(output)
    assert report.returncode == 1 and "Traceback" not in report.stdout + report.stderr, report.stdout + report.stderr
    assert "data/ is stored in the plain format, not torch" in report.stdout, report.stdout
    assert "row 1: data/ input_ids or seq_len differ" in report.stdout, report.stdout

    replace_data(torch_format=True, drop="seq_len")  # a column the trainer reads is gone
    report = _verify_cli(output)
    assert report.returncode == 1 and "Traceback" not in report.stdout + report.stderr, report.stdout + report.stderr
    assert "data/ has no seq_len column" in report.stdout, report.stdout

    rerun = run_extract(server.url, dataset, output, "--format", "speculators")  # rewrites data/ from the rows
    assert rerun.returncode == 0, rerun.stderr
    assert _verify_cli(output).returncode == 0
