"""The model fingerprint: the same for a moved copy, another for other weights, None when unreadable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hsextract.contract.model_fingerprint import SAMPLE_BYTES, SAMPLES_PER_FILE, model_fingerprint


def fake_model(path: Path, weights: bytes, config: dict[str, object] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"hidden_size": 8, "num_hidden_layers": 4}))
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_a_moved_copy_is_the_same_model_other_weights_are_not(tmp_path: Path) -> None:
    weights = bytes(range(256)) * (SAMPLES_PER_FILE * SAMPLE_BYTES // 64)  # larger than the samples: sampled
    original = fake_model(tmp_path / "a", weights, {"hidden_size": 8, "_name_or_path": "/somewhere"})
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(original, moved)
    (moved / "config.json").write_text(json.dumps({"_name_or_path": "/other/place", "hidden_size": 8}, indent=4))
    assert model_fingerprint(original) == model_fingerprint(moved) is not None

    changed = bytearray(weights)
    changed[-10] ^= 0xFF  # the last sample covers the end of the file
    other = fake_model(tmp_path / "b", bytes(changed), {"hidden_size": 8})
    assert model_fingerprint(other) != model_fingerprint(original)
    other_config = fake_model(tmp_path / "c", weights, {"hidden_size": 16})
    assert model_fingerprint(other_config) != model_fingerprint(original)


def test_no_fingerprint_without_a_readable_model(tmp_path: Path) -> None:
    assert model_fingerprint(tmp_path / "missing") is None
    assert model_fingerprint("moonshotai/Kimi-K2.5") is None  # a hub id, not a directory here
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert model_fingerprint(tmp_path / "broken") is None
