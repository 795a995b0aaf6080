"""What ``hsextract pipeline`` checks of every step's output before its first step starts: an output a later step
would refuse (another run's prepared dataset or extraction) stops the pipeline at once, not after hours of
regeneration. Each check compares only what the pipeline's sections already fix; the step re-checks it all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError


def _differences(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    return [f"{key} {recorded[key]!r} (this pipeline: {value!r})" for key, value in wanted.items() if recorded[key] != value]


def check_prepare_output(prepare: Any, config_path: Path) -> None:
    """ConfigError when prepare's ``output`` is a prepared dataset of other settings, or something else in the way."""
    from hsextract.prepare.provenance import PROVENANCE_FILE, read_provenance

    output = Path(prepare.output)
    if not output.exists():
        return
    provenance = read_provenance(output) if output.is_dir() else None
    if provenance is None:
        if output.is_dir() and not any(output.iterdir()):
            return
        raise ConfigError(f"{config_path} section prepare: output {output} exists and is not a prepared dataset; nothing "
                          "was run. Choose a new directory")
    settings = provenance.settings
    wanted: dict[str, Any] = {"like": prepare.convention, "max_seq_len": prepare.max_seq_len,
                              "chunk_rows": prepare.chunk_rows, "input_path": str(Path(prepare.dataset).resolve())}
    if prepare.specforge_template is not None:
        wanted["specforge_template"] = prepare.specforge_template
    recorded = {**vars(settings), "input_path": str(Path(settings.input_path).resolve())}
    differences = _differences(recorded, wanted)
    if differences:
        raise ConfigError(
            f"{config_path} section prepare: output {output} is a prepared dataset made with other settings "
            f"({'; '.join(differences)}; see its {PROVENANCE_FILE}); nothing was run. Choose another output, or remove it "
            "to prepare again"
        )


def check_extract_output(extract: Any, prepare: Any, config_path: Path) -> None:
    """ConfigError when extract's ``output`` was started with another format, length, shard or preparation."""
    from hsextract.extract.identity import IDENTITY_FILE, read_identity

    identity = read_identity(Path(extract.output)) if Path(extract.output).is_dir() else None
    if identity is None:
        return
    recorded: dict[str, Any] = {"format": identity.format, "max_seq_len": identity.max_seq_len,
                                "shard": (identity.shard_index, identity.num_shards)}
    wanted: dict[str, Any] = {"format": extract.format, "max_seq_len": extract.max_seq_len,
                              "shard": (extract.shard_index, extract.num_shards)}
    if identity.preparation is not None and "like" in identity.preparation:
        recorded["prepared like"], wanted["prepared like"] = identity.preparation["like"], prepare.convention
    if extract.layer_ids is not None:
        recorded["aux_layer_ids"], wanted["aux_layer_ids"] = identity.aux_layer_ids, list(extract.layer_ids)
    differences = _differences(recorded, wanted)
    if differences:
        raise ConfigError(
            f"{config_path} section extract: output {extract.output} was started with {'; '.join(differences)} (see its "
            f"{IDENTITY_FILE}); nothing was run. Choose another output for this pipeline"
        )
