"""Configs: YAML file and flags merged, flags win, unknown keys and bad values refused with the key."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from hsextract.capture.embedded.config import ServeConfig
from hsextract.config import StrictConfig, add_config_arguments, load_config
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


def cli_help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The help of one subcommand as the real CLI parser prints it, on one line per option."""
    from hsextract.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_string_list_flags_parse_through_the_cli_parser() -> None:
    from hsextract.capture.sglang.config import SGLangLaunchConfig
    from hsextract.cli import build_parser

    args = build_parser().parse_args(
        ["launch-sglang", "--model-path", "/m", "--extra-args=--attention-backend torch_native --disable-cuda-graph"]
    )
    config = load_config(SGLangLaunchConfig, args)
    assert config.extra_args == ["--attention-backend", "torch_native", "--disable-cuda-graph"]
    # integer lists stay integer lists
    args = build_parser().parse_args(["launch-sglang", "--model-path", "/m", "--layer-ids", "1,3,5"])
    assert load_config(SGLangLaunchConfig, args).layer_ids == [1, 3, 5]


@pytest.mark.parametrize("command", ["extract", "serve", "launch-sglang"])
def test_help_states_each_default_once(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = cli_help(capsys, command)
    assert "PydanticUndefined" not in text
    # one "(default: ...)" per option at most: between two flags, never two defaults
    for option in text.split(" --")[1:]:
        assert option.count("(default:") <= 1, option
    if command == "launch-sglang":
        assert "refused list (default: none)" in text


def test_unknown_key_names_the_file_and_the_nearest_key(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yml"
    config_file.write_text("dataset: d\noutput: o\nmax_seq_lenn: 5\n")
    with pytest.raises(ConfigError) as caught:
        parse(ExtractConfig, ["--config", str(config_file)])
    message = str(caught.value)
    assert f"unknown key 'max_seq_lenn' in {config_file}; did you mean max_seq_len?" in message
    assert "--max-seq-lenn" not in message


# -- integer lists (issue 29, item 7): space- or comma-separated on every command, and in YAML ---------------
INT_LIST_COMMANDS = {
    "extract": ["extract", "--dataset", "d.jsonl", "--output", "o"],
    "serve": ["serve", "--model", "m", "--dump-dir", "d"],
    "launch-sglang": ["launch-sglang", "--model-path", "/m"],
}


def _command_config(command: str, args: argparse.Namespace) -> Any:
    from hsextract.capture.sglang.config import SGLangLaunchConfig

    models: dict[str, type[StrictConfig]] = {"extract": ExtractConfig, "serve": ServeConfig, "launch-sglang": SGLangLaunchConfig}
    model = models[command]
    return load_config(model, args)


@pytest.mark.parametrize("command", list(INT_LIST_COMMANDS))
@pytest.mark.parametrize(
    "flag",
    [["1", "3", "4"], ["1,3,4"], ["1, 3, 4"], ["1", "3,4"], ["[1,3,4]"]],
    ids=["spaces", "commas", "quoted", "mixed", "brackets"],
)
def test_layer_ids_flag_takes_spaces_and_commas_on_every_command(command: str, flag: list[str]) -> None:
    from hsextract.cli import build_parser

    args = build_parser().parse_args([*INT_LIST_COMMANDS[command], "--layer-ids", *flag])
    assert _command_config(command, args).layer_ids == [1, 3, 4]


@pytest.mark.parametrize("value", ["[1, 3, 4]", '"1,3,4"', '"1 3 4"', "'1, 3, 4'", '"[1,3,4]"'])
def test_layer_ids_in_yaml_take_a_list_or_a_string(tmp_path: Path, value: str) -> None:
    config_file = tmp_path / "c.yml"
    config_file.write_text(f"dataset: d\noutput: o\nlayer_ids: {value}\n")
    assert load_config(ExtractConfig, argparse.Namespace(config=config_file)).layer_ids == [1, 3, 4]
    config_file.write_text(f"model: m\ndump_dir: d\nlayer_ids: {value}\n")
    assert load_config(ServeConfig, argparse.Namespace(config=config_file)).layer_ids == [1, 3, 4]


def test_layer_ids_in_a_pipeline_section_take_a_string(tmp_path: Path) -> None:
    from hsextract.pipeline import load_pipeline

    path = tmp_path / "pipeline.yml"
    path.write_text(
        "prepare: {model: m, dataset: c.jsonl, output: p}\n"
        'extract: {server: "http://127.0.0.1:1", output: o, layer_ids: "1,3,4"}\n'
    )
    assert load_pipeline(path).extract.layer_ids == [1, 3, 4]


def test_a_layer_list_that_is_not_integers_is_refused_naming_both_forms(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yml"
    config_file.write_text('dataset: d\noutput: o\nlayer_ids: "1,three"\n')
    with pytest.raises(ConfigError, match=r"layer_ids \(--layer-ids\).*space- or comma-separated: '1 3 4' or 1,3,4"):
        parse(ExtractConfig, ["--config", str(config_file)])
    with pytest.raises(SystemExit):
        parse(ExtractConfig, ["--dataset", "d", "--output", "o", "--layer-ids", "1", "x"])


def test_a_retired_key_says_what_replaced_it(tmp_path: Path) -> None:
    """spot_check_tolerance bounded one element against a fixed number; the check now judges each tensor against
    the engine's distance to its nearest alternative (spot_check_margin): a config that still sets it is told so."""
    config_file = tmp_path / "c.yml"
    config_file.write_text("dataset: d\noutput: o\nspot_check_tolerance: 0.05\n")
    with pytest.raises(ConfigError) as caught:
        parse(ExtractConfig, ["--config", str(config_file)])
    message = str(caught.value)
    assert f"'spot_check_tolerance' in {config_file} is no longer an option" in message
    assert "spot_check_margin" in message and "remove the key" in message
