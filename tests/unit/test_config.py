"""Configs: YAML file and flags merged, flags win, unknown keys and bad values refused with the key."""

from __future__ import annotations

import argparse
import subprocess
import sys
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


# -- issue 39: what a new user hit --------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]


def _hsextract(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI as a process: what the user types, with its exit code and its stderr."""
    return subprocess.run([str(REPO / ".venv/bin/hsextract"), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["extract", "pipeline", "prepare", "serve", "regenerate", "launch-sglang"])
def test_config_naming_a_directory_exits_2_with_a_message(tmp_path: Path, command: str) -> None:
    """Issue 39, item 7: ``--config DIR`` was an IsADirectoryError traceback (exit 1) on every command."""
    result = _hsextract(command, "--config", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "IsADirectoryError" not in result.stderr, result.stderr
    assert f"{tmp_path} is a directory, not a YAML file; give --config the file itself" in result.stderr


def _a_file(tmp_path: Path) -> Path:
    """A regular file: a path under it can be created by nobody, root included."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    return blocker


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["prepare", "--model", "{tmp}/model", "--dataset", "{tmp}/c.jsonl", "--output", "{file}/out"], "output"),
        (["regenerate", "--server", "http://127.0.0.1:9", "--dataset", "{tmp}/c.jsonl", "--output", "{file}/r.jsonl"],
         "output"),
        (["serve", "--model", "{tmp}/model", "--dump-dir", "{file}/dumps", "--port", "{port}"], "dump dir"),
        (["launch-sglang", "--model-path", "{tmp}/model", "--architecture", "llama", "--num-hidden-layers", "8",
          "--dump-dir", "{file}/dumps", "--python", sys.executable, "--port", "{port}"], "dump dir"),
        (["merge", "{tmp}/shard0", "{tmp}/shard1", "--into", "{file}/merged"], "merge target"),
    ],
    ids=["prepare", "regenerate", "serve", "launch-sglang", "merge"],
)
def test_an_uncreatable_output_exits_2_naming_it(tmp_path: Path, command: list[str], what: str) -> None:
    """Issue 39, item 7: an output, dump dir or merge target under a regular file was an OSError traceback (exit 1)."""
    from tests.helpers import free_port

    blocker = _a_file(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}\n")  # serve checks the dump dir before it loads the model
    (tmp_path / "c.jsonl").write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n')
    argv = [part.format(tmp=tmp_path, file=blocker, port=free_port()) for part in command]
    result = _hsextract(*argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"ConfigError: cannot create {what} {blocker}/" in result.stderr, result.stderr
    assert f"{blocker} is a file, not a directory" in result.stderr, result.stderr


def test_an_uncreatable_pipeline_output_stops_it_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hsextract.cli import main

    blocker = _a_file(tmp_path)
    path = tmp_path / "pipeline.yml"
    path.write_text(f"prepare: {{model: m, dataset: c.jsonl, output: p}}\n"
                    f'extract: {{server: "http://127.0.0.1:1", output: {blocker}/out}}\n')
    assert main(["pipeline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot create section extract's output {blocker}/out: {blocker} is a file" in err
    assert f"extract.output in {path}" in err


def test_a_bad_shard_index_names_both_flags_and_the_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39, item 13: it was labelled ``config (--config)`` and dumped the whole configuration."""
    from hsextract.cli import main

    code = main(["extract", "--dataset", str(tmp_path / "d.jsonl"), "--output", str(tmp_path / "o"),
                 "--shard-index", "5", "--num-shards", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--shard-index" in err and "--num-shards" in err and "give --shard-index 0 to 1" in err
    assert "config (--config)" not in err and "'dataset'" not in err, err


def test_a_list_shaped_pipeline_file_says_it_must_hold_the_sections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39, item 13: a top-level list read "prepare: Field required"."""
    from hsextract.cli import main

    path = tmp_path / "pipeline.yml"
    path.write_text("- prepare: {model: m, output: p}\n- extract: {output: o}\n")
    assert main(["pipeline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"pipeline config {path} holds a list, not a mapping" in err
    assert "sections regenerate (optional), prepare, extract and verify" in err
    assert "Field required" not in err


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_verify_names_a_path_that_is_no_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Issue 39, item 13: ``verify /nonexistent`` said "has no data_config.json nor identity.json"; ``verify FILE``
    told to rerun the extraction."""
    from hsextract.cli import main

    path = tmp_path / "out"
    if kind == "file":
        path.write_text("x\n")
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    expected = "does not exist" if kind == "missing" else "is a file, not a directory"
    assert f"ConfigError: {path} {expected}; give hsextract verify" in err, err
    assert "data_config.json" not in err and "rerun the extraction" not in err, err


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_serve_names_a_model_path_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Issue 39, item 13: ``serve --model /nonexistent`` said "has no config.json"."""
    from hsextract.cli import main
    from tests.helpers import free_port

    model = tmp_path / "model"
    if kind == "file":
        model.write_text("x\n")
    code = main(["serve", "--model", str(model), "--dump-dir", str(tmp_path / "d"), "--port", str(free_port())])
    err = capsys.readouterr().err
    assert code == 2, err
    expected = "does not exist" if kind == "missing" else "is a file, not a directory"
    assert f"ConfigError: model {model} {expected}; give --model" in err, err
    assert "config.json;" not in err, err


def test_pack_processes_default_to_a_quarter_of_the_cpus_for_long_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: none for a short run (its row threads keep up), else a quarter of the CPUs this
    process may use, 1 to 8; a value given is taken as it is, 0 included."""
    config = ExtractConfig(server="http://h:1", dataset=Path("d.jsonl"), output=Path("o"))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert config.pack_processes_for(511) == 0 and config.pack_processes_for(512) == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert config.pack_processes_for(10_000) == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(128)))
    assert config.pack_processes_for(10_000) == 8
    assert config.model_copy(update={"pack_processes": 0}).pack_processes_for(10_000) == 0
    assert config.model_copy(update={"pack_processes": 3}).pack_processes_for(10) == 3
