"""The output-format registry: one entry per format, and every other list of formats derived from it
or checked against it (the config's choices, the Ansible role's argument spec, the /dev/shm filter)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import get_args

import pytest
import yaml

from hsextract.config import add_config_arguments
from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.contract.sglang_capture import ModelFamily
from hsextract.dev.format_facts import FACTS_FILE, render
from hsextract.dev.format_facts import main as format_facts_main
from hsextract.errors import ConfigError
from hsextract.extract.config import ExtractConfig
from hsextract.output.formats import DEFAULT_FORMAT, FORMAT_NAMES, FORMATS, format_class, open_format
from hsextract.output.formats.base import OutputFormat
from hsextract.output.serving_hints import sglang_serving

REPO = Path(__file__).resolve().parents[3]


def test_every_entry_names_its_own_class(tmp_path: Path) -> None:
    assert FORMAT_NAMES == ("specforge", "speculators") and DEFAULT_FORMAT == "specforge"
    for name in FORMATS:
        cls = format_class(name)
        assert issubclass(cls, OutputFormat) and cls.name == name
        assert open_format(name, tmp_path).root == tmp_path
    with pytest.raises(ValueError, match="known formats: specforge, speculators"):
        format_class("parquet")


def test_the_config_choices_are_the_registry() -> None:
    assert get_args(ExtractConfig.model_fields["format"].annotation) == FORMAT_NAMES
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ExtractConfig)
    action = next(a for a in parser._actions if a.dest == "format")
    assert tuple(action.choices or ()) == FORMAT_NAMES
    with pytest.raises(ValueError, match="'specforge' or 'speculators'"):
        ExtractConfig(dataset=Path("d"), output=Path("o"), format="parquet")


def test_the_role_argument_spec_and_the_shm_filter_know_the_same_formats() -> None:
    specs = yaml.safe_load((REPO / "roles/hsx_extractor/meta/argument_specs.yml").read_text())["argument_specs"]
    assert tuple(specs["main"]["options"]["hsx_extractor_format"]["choices"]) == FORMAT_NAMES
    plugin = REPO / "roles/hsx_container_env/filter_plugins/shm_budget.py"
    spec = importlib.util.spec_from_file_location("hsx_shm_budget_formats", plugin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(FORMAT_NAMES) == module.FORMATS
    assert {n for n in FORMAT_NAMES if format_class(n).needs_final_prenorm} == module.FORMATS_WITH_PRENORM


def test_the_deployment_facts_are_generated_from_the_registry() -> None:
    """roles/hsx_extractor/vars/formats.yml is what the registry generates, and the role's argument spec agrees."""
    committed = (REPO / FACTS_FILE).read_text()
    assert committed == render(), f"{FACTS_FILE} is stale: run python -m hsextract.dev.format_facts"
    facts = yaml.safe_load(committed)
    assert tuple(facts["_hsx_extractor_format_names"]) == FORMAT_NAMES
    formats = facts["_hsx_extractor_formats"]
    assert formats["speculators"]["final_prenorm"] and not formats["specforge"]["final_prenorm"]
    assert formats["specforge"]["storages"] == ["auto"]
    options = yaml.safe_load((REPO / "roles/hsx_extractor/meta/argument_specs.yml").read_text())["argument_specs"]["main"]
    storages = options["options"]["hsx_extractor_storage"]["choices"]
    assert storages == facts["_hsx_extractor_format_storages"] == ["auto", FP8_STORAGE]
    assert format_facts_main(["--check", str(REPO)]) == 0


def test_the_fact_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / FACTS_FILE).parent.mkdir(parents=True)
    (tmp_path / FACTS_FILE).write_text(render().replace("final_prenorm: true", "final_prenorm: false"))
    assert format_facts_main(["--check", str(tmp_path)]) == 1
    assert format_facts_main([str(tmp_path)]) == 0 and (tmp_path / FACTS_FILE).read_text() == render()


def test_trainer_rules_belong_to_the_format() -> None:
    specforge, speculators = format_class("specforge"), format_class("speculators")
    with pytest.raises(ConfigError, match="takes exactly 3"):
        specforge.check_layers([1, 2])
    speculators.check_layers([1, 2])  # any count
    assert (specforge.trainer_length_setting, specforge.trainer_default_length) == ("data.max_length", 2048)
    assert (speculators.trainer_length_setting, speculators.trainer_default_length) == ("--total-seq-len", 8192)
    serving = sglang_serving(ModelFamily.LLAMA, [1, 15, 28], 32)
    assert speculators.trainer_settings(serving, 9000)["flags"]["--total-seq-len"] == 9000
    assert specforge.trainer_settings(serving, 10)["config"]["data"]["max_length"] == 2048


def test_bytes_per_token_from_the_stored_dtype_and_unknown_dtypes_refused() -> None:
    specforge = format_class("specforge")
    assert specforge.stored_dtype_for("float32") == "bfloat16"
    assert format_class("speculators").stored_dtype_for("float32") == "float32"
    assert specforge.bytes_per_token(3, 7168, "bfloat16") == 4 * 7168 * 2 + 16
    assert specforge.bytes_per_token(3, 64, "float32") == 4 * 64 * 4 + 16
    with pytest.raises(ConfigError, match="'int4'"):
        specforge.bytes_per_token(3, 64, "int4")


def test_storage_belongs_to_the_format() -> None:
    from hsextract.contract.files.fp8 import FP8_STORAGE, STORAGES

    assert get_args(ExtractConfig.model_fields["storage"].annotation) == ("auto", *STORAGES)
    speculators, specforge = format_class("speculators"), format_class("specforge")
    assert speculators.storages == (FP8_STORAGE,) and specforge.storages == ()
    with pytest.raises(ConfigError, match="SpecForge has no FP8 reader: use --format speculators with --storage float8_e4m3fn"):
        ExtractConfig(dataset=Path("d"), output=Path("o"), storage=FP8_STORAGE)
    assert ExtractConfig(dataset=Path("d"), output=Path("o"), format="speculators", storage=FP8_STORAGE).fp8
    assert speculators.stored_dtype_for("bfloat16", FP8_STORAGE) == FP8_STORAGE
    assert speculators.bytes_per_token(3, 7168, FP8_STORAGE) == 4 * 7168 + 4 + 16  # half of bf16's, plus a scale
    serving = sglang_serving(ModelFamily.LLAMA, [1, 15, 28], 32)
    assert speculators.trainer_settings(serving, 10, FP8_STORAGE)["flags"]["--hidden-states-backend"] == "fp8"
    assert "--hidden-states-backend" not in speculators.trainer_settings(serving, 10, "bfloat16")["flags"]
    assert speculators.quantization("bfloat16") is None and specforge.quantization(FP8_STORAGE) is None
    assert speculators.quantization(FP8_STORAGE) is not None
