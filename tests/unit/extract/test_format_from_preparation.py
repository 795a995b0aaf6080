"""The output format of a prepared dataset (issue 29 item 9): ``extract`` without ``--format`` takes the ``--like``
its ``prepare.json`` records, and refuses another naming both; the pipeline does the same with its sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hsextract.cli import build_parser
from hsextract.config import load_config
from hsextract.errors import ConfigError
from hsextract.extract.config import ExtractConfig
from hsextract.pipeline import load_pipeline
from hsextract.prepare.provenance import Provenance, Settings, write_provenance


def _prepared(directory: Path, like: str) -> Path:
    directory.mkdir(parents=True)
    settings = Settings(
        like=like, specforge_template=None, max_seq_len=4096, tokenizer_fingerprint="t", chat_template_sha256="c",
        chat_template_source="model", vocab_size=1024, input_path="conv.jsonl", input_split=None,
        input_fingerprint="f", input_rows=2, chunk_rows=1000,
    )  # fmt: skip
    write_provenance(directory, Provenance(settings, {"rows_out": 2}))
    return directory


def _extract_config(*argv: str) -> ExtractConfig:
    config: ExtractConfig = load_config(ExtractConfig, build_parser().parse_args(["extract", *argv]))
    return config


@pytest.mark.parametrize("like", ["speculators", "specforge"])
def test_extract_without_format_takes_the_like_of_prepare_json(tmp_path: Path, like: str) -> None:
    dataset = _prepared(tmp_path / "prepared", like)
    assert _extract_config("--dataset", str(dataset), "--output", str(tmp_path / "out")).format == like


def test_extract_refuses_a_format_other_than_the_preparation_naming_both(tmp_path: Path) -> None:
    dataset = _prepared(tmp_path / "prepared", "speculators")
    with pytest.raises(ConfigError) as refused:
        _extract_config("--dataset", str(dataset), "--output", str(tmp_path / "out"), "--format", "specforge")
    assert "--format specforge" in str(refused.value) and "prepared --like speculators" in str(refused.value)
    same = _extract_config("--dataset", str(dataset), "--output", str(tmp_path / "o"), "--format", "speculators")
    assert same.format == "speculators"


def _pipeline(tmp_path: Path, prepare: dict[str, Any], extract: dict[str, Any]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "prepare": {"model": str(tmp_path / "model"), "dataset": str(tmp_path / "conv.jsonl"),
                    "output": str(tmp_path / "prepared"), **prepare},
        "extract": {"output": str(tmp_path / "out"), **extract},
    }))  # fmt: skip
    return path


def test_pipeline_extract_without_format_follows_prepare_and_a_clash_is_refused(tmp_path: Path) -> None:
    steps = load_pipeline(_pipeline(tmp_path, {"like": "speculators"}, {}))
    assert steps.extract.format == "speculators" and steps.prepare.convention == "speculators"
    with pytest.raises(ConfigError) as refused:
        load_pipeline(_pipeline(tmp_path, {"like": "speculators"}, {"format": "specforge"}))
    assert "--format specforge" in str(refused.value) and "--like speculators" in str(refused.value)
    assert load_pipeline(_pipeline(tmp_path, {}, {"format": "speculators"})).prepare.convention == "speculators"
