"""data_config.json as a type: what is written is what is read back, key for key; an older output's
absent keys stay absent; a damaged file is an OutputError that says how to fix it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hsextract.errors import OutputError
from hsextract.output.data_config import DATA_CONFIG_FILE, DataConfig, read_data_config, write_data_config

MINIMAL: dict[str, Any] = {
    "format": "specforge",
    "aux_layer_ids": [1, 3, 4],
    "num_hidden_layers": 8,
    "hidden_size": 64,
    "max_seq_len": 48,
}


def test_a_file_reads_back_key_for_key_and_keeps_unknown_fields(tmp_path: Path) -> None:
    written = {
        **MINIMAL,
        "dtype": "bfloat16",
        "computed_dtype": "float32",
        "model": {"path": "/m", "fingerprint": None, "num_hidden_layers": 8, "family": "llama", "revision": "x"},
        "trainer": {"name": "specforge"},
        "from_a_newer_hsextract": {"a": 1},
    }
    (tmp_path / DATA_CONFIG_FILE).write_text(json.dumps(written))
    config = read_data_config(tmp_path)
    assert config is not None
    assert config.model.family == "llama" and config.dtype == "bfloat16" and config.total_samples == 0
    assert config.to_json() == written  # nothing added (defaults of absent keys stay absent), nothing lost
    (tmp_path / "again").mkdir()
    write_data_config(tmp_path / "again", config)
    assert json.loads((tmp_path / "again" / DATA_CONFIG_FILE).read_text()) == written


def test_the_keys_come_out_in_the_declared_order() -> None:
    config = DataConfig.model_validate({"max_seq_len": 4, **MINIMAL, "status": "complete", "total_samples": 2})
    assert list(config.to_json()) == [
        "format", "aux_layer_ids", "num_hidden_layers", "hidden_size", "max_seq_len", "total_samples", "status"
    ]  # fmt: skip
    assert config.complete


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{torn", "cannot be read"),
        ("[1, 2]", "is not a JSON object"),
        (json.dumps({**MINIMAL, "hidden_size": "wide"}), "hidden_size"),
        (json.dumps({k: v for k, v in MINIMAL.items() if k != "aux_layer_ids"}), "aux_layer_ids: missing"),
    ],
)
def test_a_damaged_file_names_what_is_wrong_and_the_fix(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / DATA_CONFIG_FILE).write_text(content)
    with pytest.raises(OutputError, match=expected) as caught:
        read_data_config(tmp_path)
    assert "rerun the extraction" in str(caught.value)


def test_no_file_is_none(tmp_path: Path) -> None:
    assert read_data_config(tmp_path) is None


def test_verify_refuses_an_output_that_does_not_say_its_format_or_sizes(tmp_path: Path) -> None:
    from hsextract.output.verify import verify_output

    (tmp_path / DATA_CONFIG_FILE).write_text(json.dumps({k: v for k, v in MINIMAL.items() if k != "hidden_size"}))
    with pytest.raises(OutputError, match="lacks hidden_size; rerun the extraction"):
        verify_output(tmp_path)
