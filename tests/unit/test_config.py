"""Configs: YAML file and flags merged, flags win, unknown keys and bad values refused with the key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hsextract.capture.embedded.config import ServeConfig
from hsextract.config import add_config_arguments, load_config
from hsextract.errors import ConfigError
from hsextract.extract.config import ExtractConfig


def parse(model: type, argv: list[str]) -> object:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, model)
    return load_config(model, parser.parse_args(argv))


def test_flags_override_the_file(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yml"
    config_file.write_text("dataset: d.jsonl\noutput: out\nmax_seq_len: 2048\nconcurrency: 4\n")
    config = parse(ExtractConfig, ["--config", str(config_file), "--max-seq-len", "1024", "--layer-ids", "1,3,4"])
    assert isinstance(config, ExtractConfig)
    assert config.max_seq_len == 1024 and config.concurrency == 4 and config.layer_ids == [1, 3, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dataset: d\noutput: o\nmax_seq_lenn: 5\n", "max_seq_lenn"),
        ("dataset: d\noutput: o\nconcurrency: 0\n", "concurrency"),
        ("dataset: d\noutput: o\nserver: localhost:30000\n", "must start with http"),
        ("output: o\n", r"dataset \(--dataset\) is required"),
        ("dataset: d\noutput: o\nshard_index: 2\nnum_shards: 2\n", "must be below num_shards"),
        ("dataset: d\noutput: o\nrid_prefix: a-b\n", "1-32 letters or digits"),
        ("- a\n", "must hold a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_config_stops_with_the_key(tmp_path: Path, text: str, message: str) -> None:
    config_file = tmp_path / "c.yml"
    config_file.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse(ExtractConfig, ["--config", str(config_file)])


def test_missing_config_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fix --config"):
        parse(ServeConfig, ["--config", str(tmp_path / "nope.yml")])


def test_serve_chunk_size() -> None:
    with pytest.raises(ConfigError, match="-1 \\(off\\) or at least 16"):
        parse(ServeConfig, ["--model", "m", "--dump-dir", "d", "--chunked-prefill-size", "8"])
