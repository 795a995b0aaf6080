"""check-draft reads a drafter config the way SGLang 0.5.23 does (real files; no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hsextract.errors import ConfigError, OutputError
from hsextract.output.drafter import check_draft, eagle_config_for, read_output_layers, write_eagle_config


def output(tmp_path: Path, aux: list[int], family: str | None, num_layers: int = 61) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    config = {"aux_layer_ids": aux, "num_hidden_layers": num_layers, "model": {"family": family}}
    (out / "data_config.json").write_text(json.dumps(config))
    return out


def drafter(tmp_path: Path, name: str = "config.json", **fields: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], **fields}))
    return path


def ids(*values: int) -> dict[str, Any]:
    return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(values)}}


def test_kimi_run_layers_need_3_31_59_on_deepseek(tmp_path: Path) -> None:
    layers = read_output_layers(output(tmp_path, [2, 30, 58], "deepseek"))
    assert eagle_config_for(layers) == {"eagle_aux_hidden_state_layer_ids": [3, 31, 59], "use_aux_hidden_state": True}
    assert check_draft(layers, drafter(tmp_path, **ids(3, 31, 59))).ok
    assert check_draft(layers, drafter(tmp_path, **ids(31, 3, 59))).ok  # SGLang captures by membership, in layer order
    for wrong, served in (({}, [2, 30, 58]), (ids(2, 30, 58), [2, 30, 58]), (ids(1, 29, 57), [2, 30, 58])):
        result = check_draft(layers, drafter(tmp_path, **wrong))
        assert not result.ok and result.served == served and result.trained == [3, 31, 59]
        assert f"serves the drafter hidden_states{served}" in result.message
        assert "holds hidden_states[3, 31, 59] (layer outputs [2, 30, 58])" in result.message
        assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [3, 31, 59]" in result.message


def test_top_level_ids_are_not_read_for_capture(tmp_path: Path) -> None:
    layers = read_output_layers(output(tmp_path, [2, 30, 58], "llama"))
    result = check_draft(layers, drafter(tmp_path, eagle_aux_hidden_state_layer_ids=[2, 30, 58]))
    assert not result.ok and "a top-level [2, 30, 58] is not read for capture" in result.message
    assert result.served == [2, 30, 58]  # SGLang's default capture


def test_aux_off_and_a_drafter_of_another_width_are_mismatches(tmp_path: Path) -> None:
    layers = read_output_layers(output(tmp_path, [1, 29, 57], "deepseek"))
    off = check_draft(layers, drafter(tmp_path, eagle_config={"use_aux_hidden_state": False}))
    assert not off.ok and off.served is None and "use_aux_hidden_state off" in off.message
    wide = check_draft(layers, drafter(tmp_path, num_aux_hidden_states=4))
    assert not wide.ok and "takes 4 aux states" in wide.message
    assert check_draft(layers, drafter(tmp_path)).ok  # no ids: SGLang's default = the default layers


def test_write_keeps_the_rest_and_refuses_a_drafter_of_another_width(tmp_path: Path) -> None:
    layers = read_output_layers(output(tmp_path, [2, 30, 58], "deepseek"))
    path = drafter(tmp_path, hidden_size=7168, eagle_config={"norm_before_fc": True, "eagle_aux_hidden_state_layer_ids": [1]})
    written = write_eagle_config(layers, path)
    on_disk = json.loads(path.read_text())
    assert on_disk == written and on_disk["hidden_size"] == 7168
    assert on_disk["eagle_config"] == {
        "norm_before_fc": True,
        "eagle_aux_hidden_state_layer_ids": [3, 31, 59],
        "use_aux_hidden_state": True,
    }
    wide = drafter(tmp_path, "wide.json", num_aux_hidden_states=4)
    with pytest.raises(ConfigError, match="num_aux_hidden_states 4"):
        write_eagle_config(layers, wide)
    assert "eagle_config" not in json.loads(wide.read_text())


def test_unknown_family_and_missing_files_name_the_fix(tmp_path: Path) -> None:
    out = output(tmp_path, [1, 29, 57], None)
    with pytest.raises(ConfigError, match="give it with --family"):
        eagle_config_for(read_output_layers(out))
    assert eagle_config_for(read_output_layers(out, "llama"))["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    with pytest.raises(ConfigError, match="choose one of deepseek, llama, qwen2"):
        read_output_layers(out, "mistral")
    with pytest.raises(OutputError, match=r"no data_config\.json"):
        read_output_layers(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        check_draft(read_output_layers(out, "llama"), tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        check_draft(read_output_layers(out, "llama"), tmp_path / "bad.json")
