"""``hsextract pipeline --config FILE``: regenerate -> prepare -> extract -> verify, one YAML file.

The file has one section per step, each holding that step's own options (the keys of
``RegenerateConfig``, ``PrepareConfig``, ``ExtractConfig``)::

    regenerate: {server: http://127.0.0.1:30000, dataset: conv.jsonl, output: work/pipeline/regenerated.jsonl}
    prepare: {model: /models/target, output: work/pipeline/prepared}   # dataset: regenerate's output
    extract: {server: http://127.0.0.1:30000, output: work/pipeline/out}  # dataset: prepare's output
    verify: true

Every section, every output already there (another run's prepared dataset or extraction:
:mod:`hsextract.pipeline_checks`) and prepare's SpecForge template (resolved from the model's chat template: a
template that fits several registry entries needs ``specforge_template``) are checked before the first step
runs, so a typo in ``extract`` stops the pipeline before hours of regeneration. Relative paths are the YAML
file's folder's.
``regenerate`` is optional (conversations used as they are). A step's
``dataset`` defaults to the previous step's output, ``prepare.format`` to ``extract.format`` and
``extract.format`` to prepare's ``like`` (two that differ are refused). Each
step resumes, and one already complete is skipped (regenerate: its ``summary.json`` with the section's
sampling, turns, reasoning and input, without asking its server, which may be gone; prepare: its
``prepare.json``; extract: a complete ``data_config.json``). At the end the output's
``data_config.json`` gets ``sources``: the regenerating model and parameters and the prepare provenance.
"""

from __future__ import annotations

import json
import logging
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from hsextract.config import StrictConfig, read_yaml_file
from hsextract.errors import ConfigError
from hsextract.extract.config import ExtractConfig, format_clash
from hsextract.pipeline_checks import check_extract_output, check_outputs_creatable, check_prepare_output, check_prepare_template

log = logging.getLogger(__name__)


class PipelineConfig(StrictConfig):
    """The sections of ``hsextract pipeline``'s YAML file."""

    regenerate: dict[str, Any] | None = Field(None, description="hsextract regenerate's options (omit: no regeneration)")
    prepare: dict[str, Any] = Field(description="hsextract prepare's options")
    extract: dict[str, Any] = Field(description="hsextract extract's options")
    verify: bool = Field(True, description="run hsextract verify on the output at the end")


@dataclass
class Steps:
    regenerate: Any  # RegenerateConfig | None
    prepare: Any  # PrepareConfig
    extract: ExtractConfig
    verify: bool
    config_path: Path | None = None  # the YAML file, for the messages of the checks run_pipeline makes first


def _section(model: type[StrictConfig], name: str, data: dict[str, Any], path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or name}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path} section {name}: {problems}; fix the section (its keys are hsextract {name}'s "
                          "options)") from None


def _is_path_field(annotation: Any) -> bool:
    return annotation is Path or Path in typing.get_args(annotation)


def resolve_paths(model: type[StrictConfig], data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The section with each relative path option made absolute against ``folder`` (the YAML file's): the file
    means the same from any directory, ``make pipeline``'s included."""
    resolved = dict(data)
    for name, field in model.model_fields.items():
        value = resolved.get(name)
        if isinstance(value, str) and _is_path_field(field.annotation) and not Path(value).expanduser().is_absolute():
            resolved[name] = str(folder / value)
    return resolved


def load_pipeline(path: Path) -> Steps:
    """Every step's config, chained and validated, or ConfigError naming the section."""
    from hsextract.prepare.config import PrepareConfig
    from hsextract.regen.config import RegenerateConfig

    loaded = read_yaml_file(path, "pipeline config")
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"pipeline config {path} holds a {type(loaded).__name__}, not a mapping: it must hold a mapping "
                          "with sections regenerate (optional), prepare, extract and verify (optional); fix --config")
    config: PipelineConfig = _section(PipelineConfig, "pipeline", loaded if isinstance(loaded, dict) else {}, path)
    folder = Path(path).resolve().parent
    regenerate = None
    if config.regenerate is not None:
        regenerate = _section(RegenerateConfig, "regenerate", resolve_paths(RegenerateConfig, config.regenerate, folder), path)
    prepare_data = resolve_paths(PrepareConfig, config.prepare, folder)
    if regenerate is not None:
        prepare_data.setdefault("dataset", str(regenerate.output))
    if "format" in config.extract and "like" not in prepare_data:  # a like that differs: format_clash below
        prepare_data.setdefault("format", config.extract["format"])
    prepare = _section(PrepareConfig, "prepare", prepare_data, path)
    extract_data = {"dataset": str(prepare.output), **resolve_paths(ExtractConfig, config.extract, folder)}
    if "format" not in config.extract:
        extract_data["format"] = prepare.convention  # the trainer the rows are prepared for
    elif config.extract["format"] != prepare.convention:
        raise ConfigError(f"{path}: " + format_clash(config.extract["format"], prepare.convention, prepare.output))
    extract = _section(ExtractConfig, "extract", extract_data, path)
    check_outputs_creatable({"regenerate": regenerate, "prepare": prepare, "extract": extract}, path)
    check_prepare_output(prepare, path)  # before the first step: not after hours of regeneration
    check_extract_output(extract, prepare, path)
    return Steps(regenerate, prepare, extract, config.verify, Path(path))


def sources(steps: Steps) -> dict[str, Any]:
    """Where the output's rows came from: regenerate's summary (model, sampling, counts), prepare.json."""
    from hsextract.prepare.provenance import read_provenance
    from hsextract.regen.writer import read_summary

    found: dict[str, Any] = {}
    if steps.regenerate is not None:
        summary = read_summary(steps.regenerate.journal_dir) or {}
        found["regenerate"] = {"output": str(steps.regenerate.output), "identity": summary.get("identity"),
                               "server": summary.get("server"), "counts": summary.get("counts")}
    provenance = read_provenance(steps.prepare.output)
    found["prepare"] = {"output": str(steps.prepare.output), **(provenance.to_json() if provenance else {})}
    return found


def _left_out(step: str, rows_in: int, by_reason: dict[str, int], errors: Path) -> str:
    """A line of the final summary: the rows ``step`` left out of its output, by reason ('' when none)."""
    count = sum(by_reason.values())
    if not count:
        return ""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items()))
    return f"\n  {step} left {count} of {rows_in} rows out ({reasons}): see {errors}"


def _rows_left_out(steps: Steps, regenerated: dict[str, Any], prepared: dict[str, Any]) -> str:
    """What regenerate and prepare left out: a later step never sees those rows, so only this says so."""
    from hsextract.prepare.provenance import ERRORS_FILE as PREPARE_ERRORS
    from hsextract.regen.journal import ERRORS_FILE as REGENERATE_ERRORS

    lines = ""
    if steps.regenerate is not None:
        by_reason = Counter(regenerated.get("failed_by_reason", {})) + Counter(regenerated.get("skipped_by_reason", {}))
        lines += _left_out("regenerate", regenerated.get("rows_in", 0), by_reason,
                           steps.regenerate.journal_dir / REGENERATE_ERRORS)
    return lines + _left_out("prepare", prepared.get("rows_in", 0), prepared.get("dropped", {}),
                             steps.prepare.output / PREPARE_ERRORS)


def run_pipeline(steps: Steps) -> int:
    """Run the steps; the exit code of the first that did not complete, else 0 (verify: 1 on a bad output)."""
    from hsextract.contract.states import RunStatus
    from hsextract.exit_codes import EXIT_FATAL, EXIT_INCOMPLETE, EXIT_INTERRUPTED
    from hsextract.extract.run import Extraction
    from hsextract.output.data_config import read_data_config, record_sources
    from hsextract.output.verify import verify_output
    from hsextract.prepare.run import run_prepare
    from hsextract.regen.run import ALREADY_COMPLETE, COMPLETE, INTERRUPTED, Regeneration, completed

    # prepare's SpecForge template, from the model's own tokenizer, before any step: not after hours of regeneration
    check_prepare_template(steps.prepare, steps.config_path or Path("pipeline config"))
    regenerated: dict[str, Any] = {}  # regenerate's counts: the rows it left out are said at the end
    if steps.regenerate is not None and (done := completed(steps.regenerate)) is not None:
        log.info("pipeline: regenerate already complete with these settings (%s); not contacting its server",
                 steps.regenerate.output)
        regenerated = done.get("counts") or {}
    elif steps.regenerate is not None:
        summary = Regeneration(steps.regenerate).run()
        log.info("pipeline: regenerate %s (%s)", summary.status, summary.output)
        if summary.status not in (COMPLETE, ALREADY_COMPLETE):
            return EXIT_INTERRUPTED if summary.status == INTERRUPTED else EXIT_INCOMPLETE
        regenerated = summary.counts
    prepared = run_prepare(steps.prepare)
    log.info("pipeline: prepare %s (%s)", "already complete" if prepared.already_complete else "complete",
             prepared.output)
    existing = read_data_config(steps.extract.output)
    if existing is not None and existing.complete:
        log.info("pipeline: extract already complete (%s)", steps.extract.output)
    else:
        from hsextract.extract.report import print_extract_summary

        result = Extraction(steps.extract).run()
        log.info("pipeline: extract %s (%s)", result.status, steps.extract.output)
        code = print_extract_summary(result, steps.extract)  # the counts, the serving and train lines
        if result.status is not RunStatus.COMPLETE:
            return code
    record_sources(steps.extract.output, sources(steps))
    if steps.verify:
        report = verify_output(steps.extract.output)
        print(report.summary())
        if not report.ok:
            return EXIT_FATAL
    print(f"PIPELINE COMPLETE: {steps.extract.output} (data_config.json sources: "
          f"{json.dumps(sorted(sources(steps)))})" + _rows_left_out(steps, regenerated, prepared.counts))
    return 0
