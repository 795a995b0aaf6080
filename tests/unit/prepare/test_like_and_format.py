"""Issue 39 item 10: ``prepare --like X --format Y`` with Y another trainer was accepted, then its "next:" line
said ``--format X``. An output's format follows its ``--like``: the contradiction stops before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hsextract.cli import main
from hsextract.errors import ConfigError
from hsextract.prepare.config import PrepareConfig

GOOD = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}


def _args(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    source = tmp_path / "c.jsonl"
    source.write_text(json.dumps(GOOD) + "\n")
    return ["prepare", "--model", str(model), "--dataset", str(source), "--output", str(tmp_path / "out"),
            "--no-progress", *extra]


@pytest.mark.parametrize(("like", "fmt"), [("speculators", "specforge"), ("specforge", "speculators")])
def test_like_and_format_of_two_trainers_are_refused_before_any_work(
    chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], like: str, fmt: str
) -> None:
    template = ("--specforge-template", "qwen") if like == "specforge" else ()  # else refused for its ambiguity
    assert main(_args(chatml_model, tmp_path, "--like", like, "--format", fmt, *template)) == 2
    err = capsys.readouterr().err
    assert err.startswith("ConfigError: ") and f"--like {like}" in err and f"--format {fmt}" in err
    assert "drop --format" in err
    assert not (tmp_path / "out").exists()


def test_like_and_format_from_a_config_file_are_checked_too(
    chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "prepare.yaml"
    config.write_text("like: speculators\n")
    assert main(_args(chatml_model, tmp_path, "--config", str(config), "--format", "specforge")) == 2
    assert "--like speculators and --format specforge" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--like speculators and --format specforge"):
        PrepareConfig.model_validate({"model": "m", "dataset": "d.jsonl", "output": "o", "like": "speculators",
                                      "format": "specforge"})


@pytest.mark.parametrize("extra", [("--like", "speculators", "--format", "speculators"), ("--format", "speculators"),
                                   ("--like", "speculators")])
def test_what_is_accepted_is_what_the_next_line_says(
    chatml_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]
) -> None:
    assert main(_args(chatml_model, tmp_path, *extra)) == 0
    out = capsys.readouterr().out
    assert "(like speculators)" in out and "next: hsextract extract --dataset" in out and "--format speculators" in out
