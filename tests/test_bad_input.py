"""Every kind of bad row is recorded with its reason and skipped; the run and the server go on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from hsextract.extract.metrics import ExtractMetrics

from .helpers import run_extraction

GOOD = {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1]}
BAD_LINES = {
    1: ("not json at all", "not_json"),
    2: (json.dumps({"loss_mask": [1]}), "missing_input_ids"),
    3: (json.dumps({"input_ids": []}), "empty_input_ids"),
    4: (json.dumps({"input_ids": [1, "two", 3]}), "input_ids_not_integer"),
    5: (json.dumps({"input_ids": [1, 2.5, 3]}), "input_ids_not_integer"),
    6: (json.dumps({"input_ids": [1, -2, 3]}), "negative_input_ids"),
    7: (json.dumps({"input_ids": [1, 1024, 3]}), "input_ids_out_of_vocab"),
    8: (json.dumps({"input_ids": [1, 2, 3], "loss_mask": [1, 1]}), "loss_mask_length"),
    9: (json.dumps([1, 2, 3]), "not_object"),
    10: ("", "empty_line"),
}


def test_each_bad_row_is_recorded_and_skipped(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    lines = [json.dumps(GOOD)] + [BAD_LINES[i][0] for i in range(1, 11)] + [json.dumps({"input_ids": list(range(300))})]
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("\n".join(lines) + "\n\n")  # trailing blank lines are not rows
    summary = run_extraction(server.url, dataset, tmp_path / "out", max_seq_len=100)
    assert summary.status == "complete"
    errors = {e["row"]: e for e in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())}
    assert {row: e["reason"] for row, e in errors.items()} == {row: reason for row, (_, reason) in BAD_LINES.items()}
    assert all(e["kind"] == "bad_input" and f"row {row}" in e["message"] for row, e in errors.items())
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["total_samples"] == 2 and config["bad_input_samples"] == 10
    assert config["truncated_samples"] == 1 and config["truncated_tokens"] == 200
    # GOOD has a loss_mask, the long row none: taken with every token supervised, and said so
    assert config["samples_without_loss_mask"] == 1
    assert config["loss_mask_source"] == "mixed: 1 of 2 samples had no loss_mask in the dataset (all ones there)"
    assert config["error_counts"]["input_ids_not_integer"] == 2
    assert httpx.get(server.url + "/health_generate").status_code == 200


def test_parquet_and_arrow_dir_datasets(model_dir, start_server, tmp_path: Path) -> None:
    import datasets

    server = start_server(model_dir("deepseek_v3"))
    rows = {"input_ids": [[1, 2, 3], [4, 5, 6, 7], [9999]], "loss_mask": [[0, 1, 1], [1, 1, 1, 1], [1]]}
    pq.write_table(pa.table(rows), tmp_path / "data.parquet")
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "arrow"))
    for source in (tmp_path / "data.parquet", tmp_path / "arrow"):
        output = tmp_path / f"out-{source.name}"
        summary = run_extraction(server.url, source, output)
        assert (summary.total_samples, summary.bad_input) == (2, 1)
        errors = [json.loads(line) for line in (output / "errors.jsonl").read_text().splitlines()]
        assert errors[0]["row"] == 2 and errors[0]["reason"] == "input_ids_out_of_vocab"


def test_server_refusing_a_prompt_records_it_and_goes_on(model_dir, start_server, tmp_path: Path) -> None:
    # The extractor's vocabulary check is overridden larger than the server's: the server refuses.
    server = start_server(model_dir("deepseek_v3"))
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(json.dumps({"input_ids": [1, 2, 2000]}) + "\n" + json.dumps(GOOD) + "\n")
    summary = run_extraction(server.url, dataset, tmp_path / "out", vocab_size=4096)
    assert summary.status == "complete" and summary.total_samples == 1
    error = json.loads((tmp_path / "out" / "errors.jsonl").read_text())
    assert error["row"] == 0 and error["reason"] == "server_rejected" and "400" in error["message"]


def _with_context(model: Path, directory: Path, context: int) -> Path:
    """A copy of ``model`` whose config.json gives a context of ``context`` tokens (max_position_embeddings)."""
    shutil.copytree(model, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return directory


def test_rows_longer_than_the_served_context_are_bad_input_not_sent(model_dir, start_server, tmp_path: Path) -> None:
    # issue 39, item 3: a 64-token context; the server (SGLang's rule) takes prompts of at most 63 tokens
    server = start_server(_with_context(model_dir("deepseek_v3"), tmp_path / "model-64", 64))
    lengths = [10, 63, 64, 150, 20]  # rows 2 and 3 are still longer than 63 tokens after the cut to 100
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps({"input_ids": [1 + i % 500 for i in range(n)]}) + "\n" for n in lengths))
    metrics = ExtractMetrics()
    summary = run_extraction(server.url, dataset, tmp_path / "out", metrics=metrics, max_seq_len=100)
    assert summary.status == "complete" and summary.total_samples == 3
    errors = {e["row"]: e for e in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())}
    assert sorted(errors) == [2, 3] and {e["reason"] for e in errors.values()} == {"longer_than_context"}
    assert all(e["kind"] == "bad_input" for e in errors.values())
    assert "64 tokens" in errors[2]["message"] and "100 tokens" in errors[3]["message"]  # after the cut, not 150
    assert "context" in errors[3]["message"] and "--max-seq-len 63" in errors[3]["message"]
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["bad_input_samples"] == 2 and config["error_counts"] == {"longer_than_context": 2}
    assert metrics.registry.get_sample_value("hsextract_errors_total", {"reason": "longer_than_context"}) == 2

    # cut to the context by --max-seq-len, the same rows fit and are written
    summary = run_extraction(server.url, dataset, tmp_path / "out-cut", max_seq_len=63)
    assert summary.status == "complete" and summary.total_samples == 5 and summary.bad_input == 0
