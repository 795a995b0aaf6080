"""The summary's train lines (issue 29 item 8): the released trainer's own entry point and a whole command,
quoted for the shell, printed only for a complete output with samples, and a draft-vocabulary hint that fits the
output. tests/trainers parses the same commands with the trainers' own parsers."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from hsextract.contract.sglang_capture import ModelFamily
from hsextract.extract.outcome import summary_lines
from hsextract.output.data_config import DataConfig
from hsextract.output.formats import format_class, token_freq
from hsextract.output.formats.specforge import SPECFORGE_RUN_CONFIG
from hsextract.output.serving_hints import sglang_serving

SERVING = sglang_serving(ModelFamily.QWEN2, [1, 3, 4], 8)


def _data_config(fmt: str, status: str = "complete", samples: int = 3) -> DataConfig:
    trainer = format_class(fmt).trainer_settings(SERVING, 100)
    return DataConfig.model_validate({
        "format": fmt, "status": status, "total_samples": samples, "aux_layer_ids": [1, 3, 4], "num_hidden_layers": 8,
        "trainer": trainer, "model": {"path": "/models/my model"},
    })  # fmt: skip


def _command(lines: list[str]) -> list[str]:
    header = next(i for i, line in enumerate(lines) if line.startswith("train with"))
    return shlex.split(lines[header + 1])


def test_speculators_line_is_its_cli_with_every_flag_and_survives_the_shell(tmp_path: Path) -> None:
    output = tmp_path / "out [v1]"  # a space and a glob character: the shell must see one word
    argv = _command(summary_lines(SERVING, _data_config("speculators"), output))
    assert argv[:4] == ["speculators", "train", "--verifier-name-or-path", "/models/my model"]
    assert argv[argv.index("--data-path") + 1] == str(output.resolve() / "data")
    assert argv[argv.index("--target-layer-ids") + 1 : argv.index("--target-layer-ids") + 4] == ["2", "4", "5"]


def test_specforge_line_runs_its_cli_on_a_run_config_written_into_the_output(tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    data_config = _data_config("specforge")
    assert data_config.trainer is not None
    argv = _command(summary_lines(SERVING, data_config, output))
    assert argv == ["specforge", "train", "--config", str(output.resolve() / SPECFORGE_RUN_CONFIG)]
    format_class("specforge").write_trainer_files(data_config.trainer, output, data_config.model.path)
    written: dict[str, Any] = yaml.safe_load(Path(argv[3]).read_text())
    assert written == {
        "model": {"target_model_path": "/models/my model", "aux_hidden_state_layer_ids": [1, 3, 4]},
        "data": {"hidden_states_path": str(output.resolve()), "max_length": 2048},
    }  # a real list in YAML, never an unquoted [1,3,4] on a command line


@pytest.mark.parametrize(("status", "samples"), [("interrupted", 2), ("stopped", 0), ("incomplete", 2), ("complete", 0)])
def test_no_train_line_for_an_output_that_is_not_complete_or_is_empty(tmp_path: Path, status: str, samples: int) -> None:
    for fmt in ("specforge", "speculators"):
        lines = summary_lines(SERVING, _data_config(fmt, status, samples), tmp_path)
        assert not any(line.startswith("train with") for line in lines), lines
        assert f"no train command: the output is {status} with {samples} samples" in lines[-1]


def test_draft_vocab_hint_never_exceeds_the_distinct_supervised_tokens(tmp_path: Path) -> None:
    output = tmp_path / "out"
    (output / "data").mkdir(parents=True)
    distribution = {token: 1000 - token for token in range(265)}
    token_freq.write(output / "data" / token_freq.TOKEN_FREQ_FILE, distribution)
    lines = summary_lines(SERVING, _data_config("speculators"), output)
    hint = lines[-1]
    assert "--draft-vocab-size N with N at most 265," in hint and "32000" not in hint
    covering = int(hint.split("(the ")[1].split(" most frequent")[0])
    ordered = sorted(distribution.values(), reverse=True)
    assert sum(ordered[:covering]) >= 0.95 * sum(ordered) > sum(ordered[: covering - 1])
