"""``hsextract pipeline``'s checks before its first step (issue 29 items 10 and 11): an output a later step would
refuse stops the pipeline at load, and relative paths in the YAML file are its folder's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from hsextract.cli import main
from hsextract.errors import ConfigError
from hsextract.pipeline import load_pipeline
from hsextract.prepare.provenance import Provenance, Settings, write_provenance

ROOT = Path(__file__).resolve().parents[2]


def _prepared(directory: Path, input_path: Path, like: str = "specforge") -> None:
    directory.mkdir(parents=True)
    settings = Settings(
        like=like, specforge_template="kimi-k2-instruct", max_seq_len=4096, tokenizer_fingerprint="t",
        chat_template_sha256="c", chat_template_source="model", vocab_size=1024, input_path=str(input_path),
        input_split=None, input_fingerprint="f", input_rows=2, chunk_rows=1000,
    )  # fmt: skip
    write_provenance(directory, Provenance(settings, {"rows_out": 2}))


def _write(path: Path, sections: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(sections))
    return path


def test_a_prepared_dataset_of_another_input_stops_the_pipeline_before_regeneration(tmp_path: Path, capsys: Any) -> None:
    # what `make extract` leaves: work/prepared made from work/conversations.jsonl
    _prepared(tmp_path / "work" / "prepared", tmp_path / "work" / "conversations.jsonl")
    path = _write(tmp_path / "pipeline.yaml", {
        "regenerate": {"server": "http://127.0.0.1:9", "dataset": "conv.jsonl", "output": "work/regenerated.jsonl"},
        "prepare": {"model": "model", "output": "work/prepared"},
        "extract": {"server": "http://127.0.0.1:9", "output": "work/out"},
    })  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        load_pipeline(path)
    message = str(refused.value)
    assert "section prepare: output" in message and "made with other settings" in message
    assert f"input_path {str(tmp_path / 'work' / 'conversations.jsonl')!r}" in message
    assert main(["pipeline", "--config", str(path)]) == 2  # and no step ran
    assert not (tmp_path / "work" / "regenerated.jsonl.journal").exists()
    assert "nothing was run" in capsys.readouterr().err


def test_an_extraction_started_otherwise_stops_the_pipeline_before_its_first_step(tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    identity = {
        "model": {"path": "/m", "fingerprint": None, "num_hidden_layers": 8}, "aux_layer_ids": [1, 3, 4],
        "format": "speculators", "max_seq_len": 4096, "hidden_size": 64, "dtype": None, "shard_index": 0,
        "num_shards": 1, "dataset": {"path": "/d", "fingerprint": None, "rows": 2},
    }  # fmt: skip
    (output / "identity.json").write_text(json.dumps(identity))
    path = _write(tmp_path / "pipeline.yaml", {
        "prepare": {"model": "model", "dataset": "conv.jsonl", "output": "prepared"},
        "extract": {"output": "out"},
    })  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        load_pipeline(path)
    assert "section extract: output" in str(refused.value) and "format 'speculators' (this pipeline: 'specforge')" in str(
        refused.value
    )


def test_relative_paths_are_the_yaml_files_folders_from_any_directory(tmp_path: Path, monkeypatch: Any) -> None:
    path = _write(tmp_path / "runs" / "pipeline.yaml", {
        "regenerate": {"server": "http://127.0.0.1:9", "dataset": "conv.jsonl", "output": "work/regenerated.jsonl"},
        "prepare": {"model": "../models/target", "output": "work/prepared", "chat_template": "t.jinja"},
        "extract": {"server": "http://127.0.0.1:9", "output": "work/out", "dump_dir": "/dev/shm/x"},
    })  # fmt: skip
    monkeypatch.chdir(ROOT)  # as `make pipeline` runs it: from the repository, not the file's folder
    steps = load_pipeline(Path(os.path.relpath(path, ROOT)))
    folder = tmp_path / "runs"
    assert steps.regenerate.dataset == folder / "conv.jsonl" and steps.regenerate.output == folder / "work/regenerated.jsonl"
    assert steps.prepare.model == folder / "../models/target" and steps.prepare.chat_template == folder / "t.jinja"
    assert steps.prepare.dataset == folder / "work/regenerated.jsonl"
    assert steps.extract.dataset == folder / "work/prepared" and steps.extract.output == folder / "work/out"
    assert steps.extract.dump_dir == Path("/dev/shm/x")


def test_a_model_whose_template_fits_several_stops_the_pipeline_before_regeneration_naming_the_yaml_key(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """Issue 39 item 6: the README's `like: specforge` pipeline regenerated every row, then prepare stopped asking
    for --specforge-template, a flag the YAML file has no such spelling of."""
    import hsextract.regen.run as regen_run
    from hsextract.dev.tokenizer import write_tokenizer

    model = write_tokenizer(tmp_path / "model", "chatml", 1024)  # ChatML fits qwen, lfm, ...
    regenerated: list[object] = []

    class Regeneration:  # records that the step started, and stops the pipeline there
        def __init__(self, config: object) -> None:
            regenerated.append(config)

        def run(self) -> SimpleNamespace:
            return SimpleNamespace(status=regen_run.INTERRUPTED, output="work/regenerated.jsonl")

    monkeypatch.setattr(regen_run, "Regeneration", Regeneration)
    path = _write(tmp_path / "pipeline.yaml", {
        "regenerate": {"server": "http://127.0.0.1:9", "dataset": "conv.jsonl", "output": "work/regenerated.jsonl"},
        "prepare": {"model": str(model), "output": "work/prepared", "like": "specforge"},
        "extract": {"server": "http://127.0.0.1:9", "output": "work/out"},
    })  # fmt: skip
    code = main(["pipeline", "--config", str(path)])
    err = capsys.readouterr().err
    assert regenerated == [], "the regeneration ran before the template was checked"
    assert code == 2
    assert "fits several SpecForge registry templates (qwen, lfm, " in err and "section prepare" in err, err
    assert "specforge_template: NAME" in err and "--specforge-template" not in err, err

    # named: the check passes it (and a name prepare does not know is refused in the YAML's spelling too)
    for name, refused in (("qwen", False), ("nope", True)):
        regenerated.clear()
        path.write_text(path.read_text().replace("like: specforge", f"like: specforge\n  specforge_template: {name}"))
        code = main(["pipeline", "--config", str(path)])
        err = capsys.readouterr().err
        assert ("specforge_template: 'nope' is not a SpecForge 0.2.0 registry template" in err) is refused, err
        assert (regenerated != []) is not refused and (code == 2) is refused
        path.write_text(path.read_text().replace(f"\n  specforge_template: {name}", ""))
