"""The summary's train commands through the released trainers' own entry points and parsers (issue 29 item 8):
the program is a console script of the pinned wheel, and its own argument resolution reads every setting back."""

from __future__ import annotations

import shlex
from importlib.metadata import distribution
from pathlib import Path

import pytest
from specforge.config.schema import load_config
from speculators.train.config import TrainConfig

from hsextract.extract.outcome import summary_lines
from hsextract.output.data_config import read_data_config
from hsextract.output.serving_hints import sglang_serving


def _command(out_path: Path) -> list[str]:
    config = read_data_config(out_path)
    assert config is not None and config.serving is not None
    serving = sglang_serving(None, config.aux_layer_ids, config.num_hidden_layers)
    lines = summary_lines(serving, config, out_path)
    header = next(i for i, line in enumerate(lines) if line.startswith("train with"))
    return shlex.split(lines[header + 1])


def _console_script(dist: str, name: str) -> str:
    scripts = {e.name: e.value for e in distribution(dist).entry_points if e.group == "console_scripts"}
    assert name in scripts, scripts
    return scripts[name]


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_specforge_command_is_its_cli_and_its_run_config_loads_with_the_recorded_settings(output, arch: str) -> None:
    out = output(arch, "specforge")
    argv = _command(out.path)
    assert argv[:2] == ["specforge", "train"] and _console_script("specforge", "specforge") == "specforge.cli:main"
    assert argv[2] == "--config"
    loaded = load_config(argv[3], argv[4:])  # what `specforge train` does first with --config and the overrides
    recorded = out.config["trainer"]["config"]
    assert loaded.data.hidden_states_path == str(out.path.resolve())
    assert loaded.data.max_length == recorded["data"]["max_length"]
    assert loaded.model.target_model_path == out.config["model"]["path"]
    assert loaded.model.aux_hidden_state_layer_ids == recorded["model"]["aux_hidden_state_layer_ids"]
    # a moved output: a scalar override on that command line is taken
    moved = load_config(argv[3], ["data.hidden_states_path=/elsewhere/out"])
    assert moved.data.hidden_states_path == "/elsewhere/out"


def test_speculators_command_is_its_cli_and_resolves_every_recorded_flag(output) -> None:
    out = output("llama", "speculators")
    argv = _command(out.path)
    assert argv[:2] == ["speculators", "train"] and _console_script("speculators", "speculators") == "speculators.__main__:app"
    resolved = TrainConfig.resolve(argv[2:])  # what `speculators train` hands its trainer
    flags = out.config["trainer"]["flags"]
    assert resolved.verifier.verifier_name_or_path == out.config["model"]["path"]
    assert resolved.data.data_path == str(out.path.resolve() / flags["--data-path"])
    assert resolved.backend_args["hidden_states_path"] == str(out.path.resolve() / flags["--hidden-states-path"])
    assert resolved.generation.on_missing == flags["--on-missing"]
    assert resolved.data.total_seq_len == flags["--total-seq-len"]
    assert resolved.draft.target_layer_ids == flags["--target-layer-ids"]
