"""The trainer settings and summary lines an output carries (the values are checked against the
released trainers' own code in tests/trainers)."""

from __future__ import annotations

from pathlib import Path

from hsextract.contract.sglang_capture import ModelFamily
from hsextract.extract.outcome import summary_lines
from hsextract.output.data_config import DataConfig
from hsextract.output.formats import format_class
from hsextract.output.formats.speculators import speculators_args
from hsextract.output.serving_hints import sglang_serving


def test_specforge_max_length_covers_the_longest_sample_and_keeps_a_larger_default() -> None:
    serving = sglang_serving(ModelFamily.DEEPSEEK, [2, 30, 58], 61)
    assert format_class("specforge").trainer_settings(serving, 100)["config"]["data"]["max_length"] == 2048
    long = format_class("specforge").trainer_settings(serving, 4096)
    assert long["config"] == {
        "model": {"aux_hidden_state_layer_ids": [3, 31, 59]},
        "data": {"hidden_states_path": ".", "max_length": 4096},
    }


def test_unknown_family_gives_no_value_and_says_why(tmp_path: Path) -> None:
    serving = sglang_serving(None, [1, 29, 57], 61)
    assert serving.draft_layer_ids is None and serving.to_json()["draft_config"] is None
    assert "set architecture" in serving.to_json()["no_value_because"]
    settings = format_class("specforge").trainer_settings(serving, 10)
    assert settings["config"]["model"] == {}  # nothing to pass: SpecForge's default would be a guess here
    data_config = DataConfig.model_validate(
        {"format": "specforge", "aux_layer_ids": [1, 29, 57], "num_hidden_layers": 61, "trainer": settings}
    )
    first = summary_lines(serving, data_config, tmp_path)[0]
    assert first.startswith("no SGLang draft-config value: the model family is unknown")


def test_speculators_args_resolve_paths_against_the_output(tmp_path: Path) -> None:
    settings = format_class("speculators").trainer_settings(sglang_serving(ModelFamily.LLAMA, [1, 15, 28], 32), 9000)
    args = speculators_args(settings, tmp_path / "out")
    assert args == [
        "--data-path", str((tmp_path / "out").resolve() / "data"),
        "--hidden-states-path", str((tmp_path / "out").resolve() / "hidden_states"),
        "--on-missing", "skip",
        "--total-seq-len", "9000",
        "--target-layer-ids", "2", "16", "29",
    ]  # fmt: skip
