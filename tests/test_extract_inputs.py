"""What extract makes of its inputs beyond the token ids: a dataset with no usable row fails (never COMPLETE),
rows without loss_mask are said and counted, and a prepared dataset's provenance is pinned by the output."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_conversations
from hsextract.errors import ConfigError, IdentityMismatchError
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


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["the-prepared-dataset", "inside-the-dataset", "holding-the-dataset", "another-directory"])
def test_an_output_that_overlaps_the_dataset_or_holds_something_else_is_refused_before_any_work(
    model_dir, start_server, tmp_path: Path, case: str, capsys
) -> None:
    model = model_dir("deepseek_v3")
    server = start_server(model)
    conversations = make_sample_conversations(tmp_path / "conversations.jsonl", num=4, seed=5)
    with open(conversations, "a", encoding="utf-8") as handle:
        handle.write("{not json\n")  # a row prepare drops: its errors.jsonl lists it
    dataset = tmp_path / "work" / "prepared"
    _prepare(model, conversations, dataset)
    assert (dataset / "errors.jsonl").read_text().count("\n") == 1
    output = {"the-prepared-dataset": dataset, "inside-the-dataset": dataset / "out", "holding-the-dataset": dataset.parent,
              "another-directory": tmp_path / "notes"}[case]
    if case == "another-directory":
        output.mkdir()
        (output / "notes.txt").write_text("mine\n")
    before = _snapshot(tmp_path)
    code = main(["extract", "--server", server.url, "--dataset", str(dataset), "--output", str(output),
                 "--health-timeout-s", "30"])
    err = capsys.readouterr().err
    assert code == 2, err  # issue 39, item 4: prepare's errors.jsonl was replaced by an empty one
    assert f"--output {output} " in err and "choose" in err
    assert _snapshot(tmp_path) == before and not (dataset / "out").exists()  # nothing written, no extract.lock either


def _prepared_for_another_model(model_dir, tmp_path: Path) -> tuple[Path, Path]:
    """Conversations prepared with the tiny Llama's tokenizer (same vocabulary size as the tiny DeepSeek, so every id is
    in range for it): what a new user gets by preparing with one model and serving another (issue 39, item 2)."""
    prepared_with = model_dir("llama")
    conversations = make_sample_conversations(tmp_path / "conversations.jsonl", num=4, seed=5)
    prepared = tmp_path / "prepared"
    _prepare(prepared_with, conversations, prepared)
    return prepared_with, prepared


def test_a_dataset_prepared_for_another_model_is_refused_before_any_request(
    model_dir, start_server, tmp_path: Path, capsys
) -> None:
    served = model_dir("deepseek_v3")
    server = start_server(served)
    prepared_with, prepared = _prepared_for_another_model(model_dir, tmp_path)
    fingerprint = json.loads((prepared / "prepare.json").read_text())["settings"]["tokenizer_fingerprint"]
    output = tmp_path / "out"
    args = ["extract", "--server", server.url, "--dataset", str(prepared), "--output", str(output)]
    code = main([*args, "--health-timeout-s", "30"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(prepared_with) in err and fingerprint[:16] in err  # the dataset's tokenizer
    assert str(served) in err  # the server's model
    assert f"--model {served}" in err  # the fix
    assert not list(Path(server.dump_dir).iterdir()) and not (output / "identity.json").exists()  # nothing was sent


def test_the_pipeline_stops_on_a_dataset_prepared_for_another_model(model_dir, start_server, tmp_path: Path, capsys) -> None:
    import yaml

    server = start_server(model_dir("deepseek_v3"))
    conversations = make_sample_conversations(tmp_path / "conversations.jsonl", num=4, seed=5)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({
        "prepare": {"model": str(model_dir("llama")), "dataset": str(conversations), "output": "prepared",
                    "like": "speculators", "progress": False},
        "extract": {"server": server.url, "output": "out", "health_timeout_s": 30},
    }))
    code = main(["pipeline", "--config", str(pipeline)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "PIPELINE COMPLETE" not in captured.out + captured.err
    assert "prepare the conversations again" in captured.err


def test_an_uncreatable_output_exits_2_naming_it(model_dir, start_server, tmp_path: Path, capsys) -> None:
    """Issue 39, item 7: an --output under a regular file (uncreatable, root included) was a NotADirectoryError
    traceback, exit 1, once the server had answered."""
    server = start_server(model_dir("deepseek_v3"))
    dataset = tmp_path / "ids.jsonl"
    dataset.write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    output = blocker / "out"
    code = main(["extract", "--server", server.url, "--dataset", str(dataset), "--output", str(output),
                 "--health-timeout-s", "30"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"ConfigError: cannot create output {output}: {blocker} is a file, not a directory" in err
    assert "--output" in err and "Traceback" not in err
    # the run itself (the pipeline's extract step starts it without the CLI): the same error, not an OSError
    with pytest.raises(ConfigError, match=re.escape(f"cannot create output {output}: {blocker} is a file")):
        run_extraction(server.url, dataset, output)
