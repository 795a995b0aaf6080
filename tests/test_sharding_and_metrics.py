"""Shards partition the rows deterministically; metrics tell the truth about the run."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hsextract.dev.sample_data import make_sample_data
from hsextract.extract.config import ExtractConfig
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.run import Extraction
from hsextract.output.verify import verify_output

from .helpers import free_port, run_extraction


def test_shards_partition_the_rows(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=7, vocab_size=1024, max_len=40)
    rows = []
    for index in range(3):
        output = tmp_path / f"shard{index}"
        run_extraction(server.url, dataset, output, shard_index=index, num_shards=3)
        rows.append([json.loads(line)["row"] for line in (output / "samples.jsonl").read_text().splitlines()])
        assert verify_output(output).ok
    assert rows == [[0, 3, 6], [1, 4], [2, 5]]


def test_metrics_are_served_and_match_the_output(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=5, vocab_size=1024, max_len=80)
    with open(dataset, "a") as handle:
        handle.write('{"input_ids": [-1]}\n')
    port = free_port()
    metrics = ExtractMetrics()
    config = ExtractConfig(
        server=server.url,
        dataset=dataset,
        output=tmp_path / "out",
        metrics_port=port,
        metrics_host="127.0.0.1",
        max_seq_len=50,
        dump_dir=server.dump_dir,
    )
    Extraction(config, metrics=metrics).run()
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    data_config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert values[("hsextract_samples_total", (("status", "ok"),))] == 5
    assert values[("hsextract_samples_total", (("status", "bad_input"),))] == 1
    assert values[("hsextract_errors_total", (("reason", "negative_input_ids"),))] == 1
    assert values[("hsextract_tokens_total", ())] == data_config["total_tokens"]
    assert values[("hsextract_truncated_samples_total", ())] == data_config["truncated_samples"]
    assert values[("hsextract_samples_planned", ())] == 6
    assert values[("hsextract_output_bytes_total", ())] == data_config["total_bytes"]
    assert values[("hsextract_request_seconds_count", ())] == 5
    assert values[("hsextract_inflight_requests", ())] == 0
    assert values[("hsextract_server_up", ())] == 1
    assert values[("hsextract_shm_total_bytes", ())] > 0 and values[("hsextract_disk_free_bytes", ())] > 0
    assert values[("hsextract_running", ())] == 0
    for stage in ("request", "wait_dump", "verify", "pack", "sync"):  # where each sample's time went
        assert values[("hsextract_stage_seconds_count", (("stage", stage),))] == 5, stage
    for stage in ("request", "verify", "pack", "sync"):  # wait_dump is 0 for a row whose dump came before its answer
        assert values[("hsextract_stage_seconds_sum", (("stage", stage),))] > 0, stage
    assert metrics.stage_totals()["pack"] == values[("hsextract_stage_seconds_sum", (("stage", "pack"),))]


def test_a_specforge_run_never_has_the_server_dump_the_pre_norm_state(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("llama"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=4, vocab_size=1024, max_len=60)
    run_extraction(server.url, dataset, tmp_path / "out")
    tokens = json.loads((tmp_path / "out" / "data_config.json").read_text())["total_tokens"]
    served = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    dumped = next(s.value for f in served for s in f.samples if s.name == "hsextract_server_dump_bytes_total")
    # input ids and 3 aux + the final state in float32, hidden 64: no fifth [T, H] tensor went to /dev/shm
    assert dumped == tokens * (8 + 4 * 64 * 4)
