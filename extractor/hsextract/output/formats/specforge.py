"""SpecForge's offline layout (what the Kimi run used).

``<out>/rows_<g>-<g+2000>/data_<row>.ckpt``: one ``torch.save`` dict a sample with
``input_ids [T]``, ``loss_mask [T]``, ``hidden_state [1,T,H]`` (final, post-norm) and
``aux_hidden_state [1,T,K*H]`` (the aux layers concatenated in layer order).

States are stored as bfloat16 whatever dtype the server computed them in: SpecForge's target head
and draft run in bfloat16, and its target head fails on any other input at the first training step.
The states are computed in the dtype the target is served in (what a served drafter sees) and
rounded once at packing, which is what SpecForge's bf16 pipeline keeps of them anyway; the run
records the conversion in data_config.json (``computed_dtype``, ``dtype_conversion``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import yaml

from hsextract.contract.files.dumps import Dump
from hsextract.durable.atomic import atomic_write_bytes, remove_quietly, temp_path
from hsextract.errors import ConfigError
from hsextract.output.checksum import WrittenFile
from hsextract.output.formats.base import OutputFormat, StoredSample
from hsextract.output.sample import Sample
from hsextract.output.sample_file import SampleFile
from hsextract.output.serving_hints import SGLangServing

ROWS_PER_DIR = 2000
#: the released SpecForge the settings are for (tests/trainers checks them against its code)
SPECFORGE_VERSION = "0.2.0"
#: SpecForge ``data.max_length``: a longer sample loses its tail in the offline normalizer
SPECFORGE_DEFAULT_MAX_LENGTH = 2048
#: SpecForge's EAGLE-3 draft takes exactly this many aux layers (``resolve_eagle_capture_layers``)
SPECFORGE_NUM_AUX_LAYERS = 3
#: the dtype SpecForge's target head and draft run in; its target head fails on any other input
SPECFORGE_DTYPE = "bfloat16"


#: the SpecForge run config the summary's command reads, written into a complete output
SPECFORGE_RUN_CONFIG = "specforge_train.yaml"


def specforge_run_config(trainer: dict[str, Any], output: Path, model: str) -> str:
    """A ``specforge train --config`` file for this output: the target model, the recorded settings, absolute paths.
    The layer ids live here, not on the command line: SpecForge's dotted override leaves ``[1,3,4]`` a string for a
    field its config does not already hold as a list, and its schema then refuses it."""
    settings = trainer["config"]
    config = {
        "model": {"target_model_path": model, **settings["model"]},
        "data": {**settings["data"], "hidden_states_path": str(Path(output).resolve() / settings["data"]["hidden_states_path"])},
    }
    header = (
        f"# SpecForge {SPECFORGE_VERSION} run config for this output, written by hsextract: specforge train --config "
        "this-file [section.field=value ...]\n# (a moved output or model: override data.hidden_states_path= or "
        "model.target_model_path=)\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False)


def _skip_zip_crc() -> None:
    # torch.save computes a CRC32 over every byte it writes: an extra pass that costs about a
    # third of the pack stage (bench/). torch.load does not need it; files load the same.
    # torch keeps the setting per thread (a ContextVar), so each write sets it on its own thread:
    # set once where the format was opened, the request threads went on computing it.
    try:
        from torch.utils.serialization import config

        config.save.compute_crc32 = False
    except (ImportError, AttributeError):  # torch older than 2.6: keep the default
        pass


class SpecForgeFormat(OutputFormat):
    name = "specforge"
    final_norm_applied = True
    sample_glob = "rows_*/data_*.ckpt"
    stored_dtype = SPECFORGE_DTYPE
    trainer_name = "specforge"
    trainer_version = SPECFORGE_VERSION
    trainer_default_length = SPECFORGE_DEFAULT_MAX_LENGTH
    trainer_length_setting = "data.max_length"
    storage_refusal = "SpecForge has no FP8 reader: use --format speculators with --storage float8_e4m3fn, or drop --storage"

    @classmethod
    def check_layers(cls, aux_layer_ids: list[int]) -> None:
        if len(aux_layer_ids) != SPECFORGE_NUM_AUX_LAYERS:
            raise ConfigError(
                f"format specforge with {len(aux_layer_ids)} aux layers {aux_layer_ids}: SpecForge's EAGLE-3 draft takes "
                f"exactly {SPECFORGE_NUM_AUX_LAYERS} (it refuses any other count at its first step); set three layer_ids "
                "or use --format speculators"
            )

    @classmethod
    def trainer_settings(cls, serving: SGLangServing, longest_sample: int, stored: str | None = None) -> dict[str, Any]:
        model: dict[str, Any] = {}
        if serving.draft_layer_ids is not None:
            model["aux_hidden_state_layer_ids"] = serving.draft_layer_ids
        return {
            "name": cls.trainer_name,
            "version": cls.trainer_version,
            "paths_relative_to": "the output directory",
            "config": {"model": model, "data": {"hidden_states_path": ".", "max_length": cls.trainer_length(longest_sample)}},
            "draft_config": None if serving.draft_layer_ids is None else {"eagle_config": serving.eagle_config()},
            "default_max_length": cls.trainer_default_length,
            "longest_sample": longest_sample,
        }

    @classmethod
    def trainer_command(cls, trainer: dict[str, Any], output: Path, model: str) -> list[str]:
        # `specforge train` (the wheel's one console script) takes a whole run config: the file below
        return ["specforge", "train", "--config", str(Path(output).resolve() / SPECFORGE_RUN_CONFIG)]

    @classmethod
    def write_trainer_files(cls, trainer: dict[str, Any], output: Path, model: str) -> None:
        atomic_write_bytes(Path(output) / SPECFORGE_RUN_CONFIG, specforge_run_config(trainer, output, model).encode())

    def sample_path(self, row: int) -> Path:
        group = row // ROWS_PER_DIR * ROWS_PER_DIR
        return self.root / f"rows_{group}-{group + ROWS_PER_DIR}" / f"data_{row}.ckpt"

    def write_sample(self, sample: Sample, dump: Dump) -> WrittenFile:
        tokens = dump.input_ids.shape[0]
        # [T, K, H] contiguous: its [1, T, K*H] view is the concatenation
        aux, final = dump.plain_states("the specforge writer")
        aux = aux.to(torch.bfloat16).contiguous()
        record = {
            "input_ids": dump.input_ids.to(torch.long),
            "loss_mask": torch.tensor(sample.loss_mask, dtype=torch.long),
            "hidden_state": final.to(torch.bfloat16).reshape(1, tokens, -1),
            "aux_hidden_state": aux.reshape(1, tokens, aux.shape[1] * aux.shape[2]),
        }
        path = self.sample_path(sample.row)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        try:
            with SampleFile(tmp, self.direct_io) as out:
                # Through a file object torch names the archive "archive", not after the temp file:
                # the same sample gives the same bytes in every run (and we hash them on the way).
                _skip_zip_crc()  # on this thread: the same bytes on every thread and in every pack process
                torch.save(record, out)  # type: ignore[arg-type]  # any object with write() will do
                written = out.finish()
            os.replace(tmp, path)  # synced by the row worker once the dump is freed, before the row is recorded
        except BaseException:
            remove_quietly(tmp)
            raise
        return written

    def read_sample(self, row: int) -> StoredSample:
        record = torch.load(self.sample_path(row), weights_only=True, mmap=True)
        hidden = record["hidden_state"]
        aux = record["aux_hidden_state"]
        tokens, width = hidden.shape[1], hidden.shape[2]
        return StoredSample(
            row=row,
            input_ids=record["input_ids"],
            loss_mask=record["loss_mask"],
            aux_hidden_states=aux.reshape(tokens, aux.shape[2] // width, width),
            final_hidden_state=hidden.reshape(tokens, width),
        )
