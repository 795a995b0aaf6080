"""A new output format is its module plus one registry line: a throwaway format, registered here, goes through
the config (flags and validation), the preflight checks, a written output that ``verify`` accepts, ``merge``,
and the deployment facts generated for Ansible, with nothing else taught about it."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file, save_file

from hsextract.config import add_config_arguments, load_config
from hsextract.contract.files.dumps import Dump, DumpMeta, DumpSource
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.states import RunStatus
from hsextract.dev import format_facts
from hsextract.durable.atomic import temp_path
from hsextract.errors import ConfigError
from hsextract.extract import preflight
from hsextract.extract.outcome import build_data_config, summary_lines
from hsextract.extract.setup import RunSetup
from hsextract.output import formats
from hsextract.output.checksum import WrittenFile, file_checksum
from hsextract.output.data_config import read_data_config, write_data_config
from hsextract.output.formats import FormatEntry, format_class
from hsextract.output.formats.base import OutputFormat, StoredSample
from hsextract.output.manifest import Manifest, WrittenSample
from hsextract.output.merge import merge_outputs
from hsextract.output.sample import Sample
from hsextract.output.serving_hints import SGLangServing
from hsextract.output.verify import verify_output

H, LAYERS = 8, [1, 2]


class ToyFormat(OutputFormat):
    """The whole format: layout, trainer rules, settings. Nothing outside this class knows it."""

    name = "toy"
    final_norm_applied = True
    sample_glob = "toy/row_*.safetensors"
    trainer_name = "toytrainer"
    trainer_version = "1.0"
    trainer_default_length = 16
    trainer_length_setting = "--max-len"
    storage_refusal = "toytrainer reads only the model's dtype: drop --storage"
    AUX_LAYERS: ClassVar[int] = 2

    @classmethod
    def check_layers(cls, aux_layer_ids: list[int]) -> None:
        if len(aux_layer_ids) != cls.AUX_LAYERS:
            raise ConfigError(f"format toy takes exactly {cls.AUX_LAYERS} aux layers, got {aux_layer_ids}")

    @classmethod
    def trainer_settings(cls, serving: SGLangServing, longest_sample: int, stored: str | None = None) -> dict[str, Any]:
        return {"name": cls.trainer_name, "version": cls.trainer_version, "max_len": cls.trainer_length(longest_sample)}

    @classmethod
    def trainer_command(cls, trainer: dict[str, Any], output: Path, model: str) -> list[str]:
        return ["toytrainer", "--data", str(Path(output).resolve()), "--max-len", str(trainer["max_len"])]

    def sample_path(self, row: int) -> Path:
        return self.root / "toy" / f"row_{row}.safetensors"

    def write_sample(self, sample: Sample, dump: Dump) -> WrittenFile:
        aux, final = dump.plain_states("the toy writer")
        path = self.sample_path(sample.row)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        save_file({"ids": dump.input_ids.to(torch.int64), "aux": aux.contiguous(), "final": final.contiguous()}, str(tmp))
        written = WrittenFile(tmp.stat().st_size, file_checksum(tmp))
        os.replace(tmp, path)
        return written

    def read_sample(self, row: int) -> StoredSample:
        tensors = load_file(str(self.sample_path(row)))
        return StoredSample(row, tensors["ids"], None, tensors["aux"], tensors["final"])


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``toy`` registered with its one line; yields the config module re-read with the new registry."""
    monkeypatch.setitem(formats.FORMATS, "toy", FormatEntry(__name__, "ToyFormat", "a throwaway test format"))
    monkeypatch.setattr(formats, "FORMAT_NAMES", tuple(formats.FORMATS))
    config_module = importlib.import_module("hsextract.extract.config")
    try:
        yield importlib.reload(config_module)  # ExtractConfig.format's choices come from the registry at import
    finally:
        monkeypatch.undo()
        importlib.reload(config_module)


def _config(config_module: ModuleType, argv: list[str]) -> Any:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, config_module.ExtractConfig)
    return load_config(config_module.ExtractConfig, parser.parse_args(argv))


def _info() -> ServerInfo:
    return ServerInfo(
        model_path="/models/toy", num_layers=4, hidden_size=H, vocab_size=100, dtype="float32", layer_ids=LAYERS,
        dump_dir="/dev/shm/x", engine="hsextract-embedded", provides_final_prenorm=True,
    )  # fmt: skip


def _dump(row: int, tokens: int) -> Dump:
    source = DumpSource("test", "1", "/models/toy", LAYERS, [i + 1 for i in LAYERS])
    meta = DumpMeta(f"r{row}", tokens, len(LAYERS), H, "float32", False, 1, 0.0, source)
    generator = torch.Generator().manual_seed(row)
    return Dump(
        f"r{row}",
        torch.arange(tokens),
        meta,
        aux_hidden_states=torch.randn(tokens, len(LAYERS), H, generator=generator),
        final_hidden_state=torch.randn(tokens, H, generator=generator),
    )


def _extract(config_module: ModuleType, out: Path, dataset: Path, shard: int, num_shards: int, rows: int) -> None:
    """What a run does at its end, through the real writer, manifest and data_config."""
    cfg = _config(
        config_module,
        ["--dataset", str(dataset), "--output", str(out), "--format", "toy", "--architecture", "llama",
         "--shard-index", str(shard), "--num-shards", str(num_shards)],
    )  # fmt: skip
    out.mkdir(parents=True)
    fmt = format_class(cfg.format)(cfg.output)
    serving = preflight.serving_and_trainer_guards(cfg, _info(), LAYERS, fmt)
    manifest = Manifest(out)
    for row in range(shard, rows, num_shards):
        sample = Sample(row, list(range(3 + row)), [1] * (3 + row), 3 + row)
        written = fmt.write_sample(sample, _dump(row, 3 + row))
        manifest.add_written(WrittenSample(row, fmt.relative(row), 3 + row, 3 + row, written.bytes, written.checksum))
    manifest.close()
    rows_in_shard = len(range(shard, rows, num_shards))
    setup = RunSetup(cfg, _info(), LAYERS, out, fmt, serving)
    config = build_data_config(setup, manifest, rows_in_shard, RunStatus.COMPLETE)
    write_data_config(out, config)


def test_a_registered_format_runs_through_config_preflight_verify_merge_and_the_ansible_facts(
    toy: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("")
    # the config: a flag choice, validated; the format's own storage rule
    cfg = _config(toy, ["--dataset", str(dataset), "--output", str(tmp_path / "o"), "--format", "toy"])
    assert cfg.format == "toy"
    with pytest.raises(ConfigError, match="toytrainer reads only the model's dtype"):
        _config(toy, ["--dataset", str(dataset), "--output", "o", "--format", "toy", "--storage", "float8_e4m3fn"])
    # preflight: the format's layer rule, its size per token, and the messages that list formats
    fmt = format_class("toy")
    with pytest.raises(ConfigError, match="format toy takes exactly 2"):
        preflight.serving_and_trainer_guards(cfg, _info(), [1, 2, 3], fmt(tmp_path))
    assert fmt.bytes_per_token(2, H, "float32") == 3 * H * 4 + 16
    assert "--format toy" in preflight._formats_where(lambda f: not f.needs_final_prenorm)
    # a written output (two shards) that verify accepts, merged into one that verify accepts
    shards = [tmp_path / "s0", tmp_path / "s1"]
    for index, shard in enumerate(shards):
        _extract(toy, shard, dataset, index, 2, rows=5)
        report = verify_output(shard)
        assert report.ok, report.problems
    summary = merge_outputs(shards, tmp_path / "merged")
    assert (summary.samples, summary.tokens) == (5, sum(3 + r for r in range(5)))
    merged = verify_output(tmp_path / "merged")
    assert merged.ok and merged.samples == 5, merged.problems
    assert sorted(p.name for p in (tmp_path / "merged" / "toy").iterdir()) == [f"row_{r}.safetensors" for r in range(5)]
    # the end-of-run summary asks the format
    merged_config = read_data_config(tmp_path / "merged")
    assert merged_config is not None
    lines = summary_lines(SGLangServing(None, LAYERS, 4, None), merged_config, tmp_path)
    assert lines[1] == "train with toytrainer 1.0:" and lines[2].startswith("  toytrainer --data")
    # the deployment's facts: generated from the registry, the new format included
    facts = format_facts.format_facts()
    assert facts["_hsx_extractor_format_names"] == [*formats.FORMAT_NAMES]
    assert facts["_hsx_extractor_formats"]["toy"] == {
        "storages": ["auto"],
        "final_prenorm": False,
        "storage_refusal": "toytrainer reads only the model's dtype: drop --storage",
    }
    assert "toy:" in format_facts.render()
    with caplog.at_level(logging.WARNING):
        assert format_facts.main(["--check", str(Path(__file__).resolve().parents[3])]) == 1  # the committed file lacks toy


def test_the_registry_is_back_to_its_own_formats_after_the_toy() -> None:
    assert "toy" not in formats.FORMATS and "toy" not in formats.FORMAT_NAMES
    with pytest.raises(ValueError, match="'specforge' or 'speculators'"):
        importlib.import_module("hsextract.extract.config").ExtractConfig(dataset=Path("d"), output=Path("o"), format="toy")
