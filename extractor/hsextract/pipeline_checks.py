"""What ``hsextract pipeline`` checks of every step's output before its first step starts: an output a later step
would refuse (another run's prepared dataset or extraction) stops the pipeline at once, not after hours of
regeneration. Each check compares only what the pipeline's sections already fix; the step re-checks it all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError
from hsextract.paths import check_creatable


def _differences(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    return [f"{key} {recorded[key]!r} (this pipeline: {value!r})" for key, value in wanted.items() if recorded[key] != value]


def check_outputs_creatable(steps: dict[str, Any], config_path: Path) -> None:
    """ConfigError when a step's ``output`` (``steps``: section name -> its config, None: no such step) cannot be
    created: a file where a directory should be, a directory this user cannot write."""
    for name, step in steps.items():
        if step is not None:
            check_creatable(Path(step.output), f"section {name}'s output", f"{name}.output in {config_path}")


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


def check_prepare_template(prepare: Any, config_path: Path) -> str | None:
    """The SpecForge registry template prepare will use (None: speculators), resolved as prepare resolves it, from the
    model's tokenizer and chat template; ConfigError naming the section's key ``specforge_template`` when the model's
    template fits several entries or none, or the key names one prepare does not handle. A model whose tokenizer
    cannot be loaded stops here too, before regeneration rather than after it."""
    from hsextract.prepare.model_tokenizer import load_model_tokenizer
    from hsextract.prepare.registry import resolve_template

    where = f"{config_path} section prepare"
    if prepare.convention != "specforge":
        if prepare.specforge_template is not None:
            raise ConfigError(f"{where}: specforge_template {prepare.specforge_template} applies to like specforge only; "
                              "speculators renders with the model's own template: drop it. Nothing was run")
        return None
    try:
        tokenizer = load_model_tokenizer(prepare.model, prepare.chat_template, prepare.trust_remote_code).tokenizer
        return resolve_template(prepare.specforge_template, tokenizer, str(prepare.model), "specforge_template:").name
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}; nothing was run") from None


def check_extract_output(extract: Any, prepare: Any, config_path: Path) -> None:
    """ConfigError when extract's ``output`` was started with another format, length, shard or preparation."""
    from hsextract.output.identity import IDENTITY_FILE, read_identity_or_torn

    # a torn identity.json (a power loss) is rewritten by the extract step itself
    identity, _ = read_identity_or_torn(Path(extract.output)) if Path(extract.output).is_dir() else (None, False)
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
