"""What extract makes of its inputs beyond the token ids: a dataset with no usable row fails (never COMPLETE),
rows without loss_mask are said and counted, and a prepared dataset's provenance is pinned by the output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_conversations
from hsextract.errors import IdentityMismatchError
from hsextract.extract.metrics import ExtractMetrics
from hsextract.prepare import PrepareConfig
from hsextract.prepare.run import run_prepare

from .helpers import run_extraction


def test_a_dataset_with_no_usable_row_stops_with_a_failure(model_dir, start_server, tmp_path: Path, capsys) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = tmp_path / "empty-rows.jsonl"
    dataset.write_text('{"input_ids": []}\n{"input_ids": [1, -5]}\n{"input_ids": []}\n')
    output = tmp_path / "out"
    args = ["extract", "--server", server.url, "--dataset", str(dataset), "--output", str(output)]
    code = main([*args, "--health-timeout-s", "30"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and config["total_samples"] == 0 and config["bad_input_samples"] == 3
    assert "no row of the dataset is usable: all 3 rows were recorded as bad input" in config["stop_reason"]
    assert "2 of them empty_input_ids" in config["stop_reason"]
    assert "COMPLETE" not in captured.out + captured.err
    assert f"error: {config['stop_reason']}" in captured.err and "error: None" not in captured.err  # issue 29, item 3
    assert main(["verify", str(output)]) == 1


def test_rows_without_loss_mask_are_counted_in_data_config_and_metrics(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = tmp_path / "ids.jsonl"
    dataset.write_text("".join(json.dumps({"input_ids": list(range(1, 4 + i))}) + "\n" for i in range(5)))
    metrics = ExtractMetrics()
    summary = run_extraction(server.url, dataset, tmp_path / "out", metrics=metrics)
    assert summary.status == "complete"
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["samples_without_loss_mask"] == 5
    assert config["loss_mask_source"] == "all ones: the dataset had none"
    assert metrics.registry.get_sample_value("hsextract_samples_without_loss_mask_total") == 5
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["loss_mask_given"] for r in records] == [False] * 5


def _prepare(model: Path, conversations: Path, output: Path, chat_template: Path | None = None) -> None:
    run_prepare(
        PrepareConfig(
            model=model, dataset=conversations, output=output, like="speculators", chat_template=chat_template, progress=False
        )
    )


def test_a_prepared_dataset_is_pinned_by_the_output(model_dir, start_server, tmp_path: Path) -> None:
    model = model_dir("deepseek_v3")
    server = start_server(model)
    conversations = make_sample_conversations(tmp_path / "conversations.jsonl", num=6, seed=3)
    prepared = tmp_path / "prepared"
    _prepare(model, conversations, prepared)
    output = tmp_path / "out"
    summary = run_extraction(server.url, prepared, output, format="speculators")
    assert summary.status == "complete" and summary.total_samples > 0
    provenance = json.loads((prepared / "prepare.json").read_text())
    identity = json.loads((output / "identity.json").read_text())
    assert identity["preparation"]["chat_template_sha256"] == provenance["settings"]["chat_template_sha256"]
    assert identity["preparation"]["like"] == "speculators"
    config = json.loads((output / "data_config.json").read_text())
    assert config["dataset_preparation"] == provenance
    assert config["loss_mask_source"] == "the dataset's loss_mask" and config["samples_without_loss_mask"] == 0

    # the same conversations prepared again with another chat template, at the same path: refused on resume
    template = tmp_path / "other.jinja"
    template.write_text("{#- another revision of the template -#}\n" + provenance_template(model))
    shutil.rmtree(prepared)
    _prepare(model, conversations, prepared, chat_template=template)
    with pytest.raises(IdentityMismatchError, match="dataset preparation"):
        run_extraction(server.url, prepared, output, format="speculators")


def provenance_template(model: Path) -> str:
    config = json.loads((model / "tokenizer_config.json").read_text())
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    return (model / "chat_template.jinja").read_text()
