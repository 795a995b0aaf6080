"""Which existing --output extract takes (issue 39, item 4): its own output or an empty directory; not the dataset,
nor a directory around or inside it, nor one holding something else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hsextract.durable.atomic import temp_path
from hsextract.durable.lock import LOCK_FILE
from hsextract.errors import ConfigError
from hsextract.extract.config import ExtractConfig
from hsextract.extract.preflight import check_output_dir


def _check(dataset: Path, output: Path) -> None:
    check_output_dir(ExtractConfig(server="http://127.0.0.1:1", dataset=dataset, output=output))


@pytest.mark.parametrize("left", ["nothing", "a-killed-runs-lock-and-temp-file", "identity.json", "data_config.json",
                                  "samples.jsonl", "lost+found"])
def test_a_new_empty_or_own_output_is_taken(tmp_path: Path, left: str) -> None:
    dataset, output = tmp_path / "data.jsonl", tmp_path / "out"
    _check(dataset, output)  # not there yet
    output.mkdir()
    if left == "a-killed-runs-lock-and-temp-file":
        (output / LOCK_FILE).write_text("{}\n")
        temp_path(output / "identity.json").write_text("{")
    elif left == "lost+found":  # a fresh filesystem mounted as the output
        (output / left).mkdir()
    elif left != "nothing":
        (output / left).write_text("{}\n")
    _check(dataset, output)


def test_an_output_overlapping_the_dataset_or_holding_something_else_is_refused(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "errors.jsonl").write_text('{"row": 3}\n')
    for output in (prepared, prepared / "out", tmp_path, tmp_path / "prepared" / ".." / "prepared"):
        with pytest.raises(ConfigError, match=re.escape(f"--output {output} overlaps --dataset {prepared} ")):
            _check(prepared, output)
    with pytest.raises(ConfigError, match=re.escape(f"--output {prepared} is not empty and holds no extraction output")):
        _check(tmp_path / "data.jsonl", prepared)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        _check(tmp_path / "data.jsonl", tmp_path / "file")
