"""Dataset edits between runs: every row whose content changed is redone, and only those."""

from __future__ import annotations

import json
from pathlib import Path

from ..helpers import run_extraction
from .helpers import assert_same_output, kill_after_samples, make_rows, run_extract, start_extract, write_rows


def test_row_inserted_at_the_top_after_sigkill_redoes_every_shifted_row(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    rows = make_rows(14, seed=5)
    dataset = write_rows(tmp_path / "data.jsonl", rows)
    output = tmp_path / "out"
    written = kill_after_samples(start_extract(server.url, dataset, output), output, 4)
    assert 4 <= written < 14

    write_rows(dataset, [*make_rows(1, seed=99), *rows])  # one new row 0: every old row moves down one
    reference = tmp_path / "reference"
    assert run_extraction(server.url, dataset, reference, concurrency=1).total_samples == 15

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)
    assert "changed since this output was started" in rerun.stderr


def test_rows_edited_removed_or_made_bad_after_a_finished_run(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    rows = make_rows(10, seed=6)
    dataset = write_rows(tmp_path / "data.jsonl", rows)
    output = tmp_path / "out"
    assert run_extraction(server.url, dataset, output, concurrency=1).total_samples == 10
    untouched = {p.name: p.stat().st_mtime_ns for p in output.rglob("*.ckpt") if p.name not in ("data_3.ckpt", "data_7.ckpt")}

    edited = [dict(r) for r in rows[:9]]  # the last row is deleted
    edited[3] = make_rows(1, seed=123)[0]  # new content in place
    edited[7] = {"input_ids": []}  # now bad input
    write_rows(dataset, edited)
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)

    rerun = run_extraction(server.url, dataset, output, concurrency=1)
    assert rerun.written_now == 1 and rerun.bad_input == 1, rerun
    assert {p.name: p.stat().st_mtime_ns for p in output.rglob("*.ckpt") if p.name in untouched} == {
        k: v for k, v in untouched.items() if k != "data_9.ckpt"
    }, "rows whose content did not change were rewritten"
    assert not (output / "rows_0-2000" / "data_9.ckpt").exists() and not (output / "rows_0-2000" / "data_7.ckpt").exists()
    errors = [json.loads(line) for line in (output / "errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["reason"]) for e in errors] == [(7, "empty_input_ids")]
    assert_same_output(output, reference)
