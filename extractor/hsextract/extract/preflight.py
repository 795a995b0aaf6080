"""Checks before any work: the server, the layers and the trainers' limits, the output's identity,
and the disk. Nothing is written to the output before all of them pass (the identity is written last)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from hsextract.contract.files.dump_dir import check_dump_root
from hsextract.contract.files.dump_pages import huge_pages_advice
from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.contract.layers import resolve_aux_layer_ids, server_layers_mismatch
from hsextract.contract.model_config import read_model_config
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.sglang_capture import ModelFamily, family_of
from hsextract.durable.atomic import is_temp_name
from hsextract.durable.lock import LOCK_FILE
from hsextract.errors import (
    ConfigError,
    DiskSpaceError,
    IdentityMismatchError,
    OutputError,
    ServerError,
)
from hsextract.extract.config import ExtractConfig
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.planning.context_fit import log_context_limit
from hsextract.extract.planning.dataset import dataset_kind
from hsextract.extract.planning.dataset_shape import check_shape
from hsextract.extract.planning.plan import Plan
from hsextract.extract.planning.scan import DatasetScan
from hsextract.extract.planning.served_tokenizer import check_served_tokenizer
from hsextract.extract.requests.client import ServerClient
from hsextract.extract.setup import RunSetup
from hsextract.output.data_config import DATA_CONFIG_FILE, read_data_config
from hsextract.output.formats import FORMATS, format_class, open_format
from hsextract.output.formats.base import OutputFormat
from hsextract.output.identity import (
    IDENTITY_FILE,
    DatasetIdentity,
    ModelIdentity,
    OutputIdentity,
    identity_from_data_config,
    preparation_identity,
    read_identity_or_torn,
    reconcile_identity,
    write_identity,
)
from hsextract.output.manifest import SAMPLES_FILE, forget_every_row, read_jsonl
from hsextract.output.sample_file import choose_direct
from hsextract.output.serving_hints import SGLangServing, sglang_serving
from hsextract.prepare.provenance import read_provenance

log = logging.getLogger(__name__)

#: a file only an extraction output holds: identity.json (recorded before a run's first request), data_config.json (an
#: older hsextract's), samples.jsonl (one whose identity.json was lost: establish_identity refuses it, saying so)
_OUTPUT_MARKERS = (IDENTITY_FILE, DATA_CONFIG_FILE, SAMPLES_FILE)


def check_output_dir(cfg: ExtractConfig) -> None:
    """Refuse, before anything is written into it, an --output that overlaps the dataset, or an existing one that
    holds something else than an extraction output: the run would write its files over what is there. An empty
    directory, or a resume of an extraction output, is let through."""
    output, dataset = cfg.output, cfg.dataset
    if _overlaps(output, dataset):
        raise ConfigError(
            f"--output {output} overlaps --dataset {dataset} (the same path, or one inside the other): the run would "
            "write its files among the dataset's. Nothing was done; choose an --output outside the dataset"
        )
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} exists and is not a directory; choose another --output")
    if output.is_dir() and not _is_extraction_output(output):
        raise ConfigError(
            f"--output {output} is not empty and holds no extraction output (no {', '.join(_OUTPUT_MARKERS)}): the run "
            "would write over what is there. Nothing was done; choose an empty or new directory"
        )


def _overlaps(output: Path, dataset: Path) -> bool:
    output, dataset = output.resolve(), dataset.resolve()
    return output == dataset or output in dataset.parents or dataset in output.parents


def _is_extraction_output(directory: Path) -> bool:
    """Ours: a marker file, or nothing but what a run killed before it recorded its identity leaves (its lock and
    temp files); an empty directory too, or a fresh filesystem's root (a data disk mounted as the output)."""
    if any((directory / name).is_file() for name in _OUTPUT_MARKERS):
        return True
    return all(e.name in (LOCK_FILE, "lost+found") or is_temp_name(e.name) for e in directory.iterdir())


def prepare(cfg: ExtractConfig, client: ServerClient, metrics: ExtractMetrics, stop: threading.Event) -> RunSetup:
    """Every check that needs only the server: the run's :class:`RunSetup` (without its identity yet)."""
    info, aux, dump_dir, fmt = check_server(cfg, client, metrics, stop)
    serving = serving_and_trainer_guards(cfg, info, aux, fmt)
    provenance = read_provenance(cfg.dataset) if cfg.dataset.is_dir() else None
    check_served_tokenizer(provenance, info, cfg.dataset)
    log_context_limit(info.context_length, cfg.max_seq_len)
    preparation = None if provenance is None else provenance.to_json()
    return RunSetup(cfg, info, aux, dump_dir, fmt, serving, dataset_preparation=preparation)


def check_server(
    cfg: ExtractConfig, client: ServerClient, metrics: ExtractMetrics, stop: threading.Event
) -> tuple[ServerInfo, list[int], Path, OutputFormat]:
    """The server answers, serves what the config asks for, and dumps where the extractor can read."""
    dataset_kind(cfg.dataset)  # raises DatasetError with the fix
    check_shape(cfg.dataset, cfg.require_loss_mask)  # conversations, not token ids: refused before any request
    client.wait_until_healthy(cfg.health_timeout_s, stop)
    metrics.server_up.set(1)
    try:
        info = client.server_info(cfg.vocab_size)
    except ServerError:
        if stop.is_set():  # cancelled by a signal: an interruption, not a server problem
            raise KeyboardInterrupt from None
        raise
    if cfg.expect_model and not info.model_path.rstrip("/").endswith(cfg.expect_model.rstrip("/")):
        raise ConfigError(
            f"the server serves {info.model_path!r}, not the expected model {cfg.expect_model!r}; "
            "restart the server with the right model or fix expect_model"
        )
    if info.model_path and not info.model_path.startswith("/"):
        log.warning(
            "the server reports the model path %r, relative to where it was started; the output records it as is",
            info.model_path,
        )
    aux = resolve_aux_layer_ids(cfg.layer_ids or info.layer_ids, info.num_layers)
    if info.layer_ids is not None and list(info.layer_ids) != aux:
        raise ConfigError(server_layers_mismatch(aux, info.layer_ids))
    if cfg.dump_dir is not None:
        check_dump_root(cfg.dump_dir)  # an unsafe root is refused as such, before it is compared with the server's
    dump_dir = _dump_dir(cfg.dump_dir, info.dump_dir)
    check_dump_root(dump_dir)
    if advice := huge_pages_advice(dump_dir):
        log.info("%s", advice)
    fmt = open_format(cfg.format, cfg.output)
    fmt.direct_io, why = choose_direct(cfg.output_io, cfg.output)
    log.info("sample files written %s (%s)", "with direct I/O" if fmt.direct_io else "buffered", why)
    if fmt.needs_final_prenorm and info.provides_final_prenorm is False:
        raise ConfigError(
            f"format {cfg.format} needs the pre-norm final state, which this server does not dump; "
            f"use {_formats_where(lambda f: not f.needs_final_prenorm)} or enable the pre-norm dump in the server's hook config"
        )
    _check_hook_storage(cfg, info)
    return info, aux, dump_dir, fmt


def _dump_dir(configured: Path | None, reported: str | None) -> Path:
    """The dump root to read: ``--dump-dir`` when it is the server's (or the server names none), else the server's.

    A ``--dump-dir`` that is another directory than the one the server reports would let every row
    wait ``dump_timeout_s`` for a dump that lands elsewhere: refused before any request. When the
    server's path does not exist on this machine (a container that mounts the dump tmpfs elsewhere,
    docker/README.md), the two cannot be compared and ``--dump-dir`` is taken as the same directory.
    """
    if configured is None:
        if not reported:
            raise ConfigError("the server does not say where it dumps; set dump_dir (--dump-dir) to its dump root")
        return Path(reported)
    if not reported:
        return configured
    server_side = Path(reported)
    if server_side.is_dir() and configured.is_dir():
        same = os.path.samefile(server_side, configured)  # a bind mount or symlinked parent is the same directory
    elif server_side.exists():
        same = server_side.resolve() == configured.resolve()
    else:
        log.info(
            "the server reports dump dir %s, which does not exist here: reading its dumps through --dump-dir %s "
            "(the same tmpfs mounted at another path)",
            reported,
            configured,
        )
        return configured
    if not same:
        raise ConfigError(
            f"--dump-dir {configured} is not the dump dir the server reports in /server_info ({reported}): every "
            f"dump would be waited for in the wrong place. Drop --dump-dir (the server's is used), pass --dump-dir "
            f"{reported}, or restart the server with dump_dir {configured}"
        )
    return configured


def _check_hook_storage(cfg: ExtractConfig, info: ServerInfo) -> None:
    """A server whose hook dumps every request in one storage (SGLang) must dump what this output
    stores: refused here, before any request, rather than at the first dump."""
    if info.fp8_per_request or info.hook_storage is None:
        return  # asked per request, or not said: every dump's storage is checked as it comes
    server_fp8 = info.hook_storage == FP8_STORAGE
    if cfg.fp8 and not server_fp8:
        raise ConfigError(
            f"--storage {cfg.storage} asks for FP8, but the server's dump hook stores the model's dtype (its config in "
            "/server_info forward_hooks has no storage). Restart SGLang with the hook's storage float8_e4m3fn (launcher "
            "config storage; Ansible hsx_hidden_dtype: float8_e4m3fn), or drop --storage"
        )
    if server_fp8 and not cfg.fp8:
        raise ConfigError(
            f"the server's dump hook stores every dump as {FP8_STORAGE} (its config in /server_info forward_hooks), but "
            f"this run stores the model's dtype. Pass --storage {FP8_STORAGE} ({_fp8_formats()} format), or restart SGLang "
            "without the hook's storage"
        )


def _formats_where(test: Callable[[type[OutputFormat]], bool]) -> str:
    """``--format A or --format B``: the registry's formats that pass ``test`` (the formats say, not this module)."""
    return " or ".join(f"--format {name}" for name in FORMATS if test(format_class(name)))


def _fp8_formats() -> str:
    return ", ".join(name for name in FORMATS if FP8_STORAGE in format_class(name).storages)


def serving_and_trainer_guards(cfg: ExtractConfig, identity: ServerInfo, aux: list[int], fmt: OutputFormat) -> SGLangServing:
    """Refuse what the trainer or SGLang would fail on later; the SGLang value for these layers."""
    fmt.check_layers(aux)
    if cfg.architecture != "auto":
        family: ModelFamily | None = ModelFamily(cfg.architecture)
    else:
        family = family_of(read_model_config(identity.model_path)) if identity.model_path else None
        if family is None:
            log.warning(
                "the model family of %r is unknown here: data_config.json will carry no SGLang draft-config value; "
                "set architecture (--architecture deepseek|llama|qwen2) to get it",
                identity.model_path,
            )
    serving = sglang_serving(family, aux, identity.num_layers)  # ConfigError when SGLang cannot serve them
    computed = identity.dtype
    if fmt.stored_dtype is not None and computed is not None and computed != fmt.stored_dtype:
        log.info(
            "the server computes %s states; format %s stores them as %s (its trainer runs in %s), recorded in data_config.json",
            computed,
            fmt.name,
            fmt.stored_dtype,
            fmt.stored_dtype,
        )
    return serving


def establish_identity(setup: RunSetup, scan: DatasetScan) -> OutputIdentity:
    """Check this run against what the output holds, and record it before the first request."""
    cfg, info, aux, fmt = setup.config, setup.server, setup.aux_layer_ids, setup.fmt
    current = OutputIdentity(
        model=ModelIdentity(info.model_path, info.model_fingerprint, info.num_layers),
        aux_layer_ids=aux,
        format=cfg.format,
        max_seq_len=cfg.max_seq_len,
        hidden_size=info.hidden_size,
        dtype=info.dtype,
        stored_dtype=fmt.stored_dtype_for(info.dtype, cfg.storage),
        shard_index=cfg.shard_index,
        num_shards=cfg.num_shards,
        dataset=DatasetIdentity(str(scan.path), scan.fingerprint, scan.total_rows),
        preparation=preparation_identity(setup.dataset_preparation),
    )
    recorded, torn = read_identity_or_torn(cfg.output)
    if torn:
        log.warning("%s is empty or torn (a power loss while it was written): it is written again", cfg.output / IDENTITY_FILE)
    _refuse_mixed_storage(cfg, recorded, current.stored_dtype)
    if recorded is None:
        try:
            legacy = read_data_config(cfg.output)
        except OutputError:
            legacy = None
        recorded = identity_from_data_config(legacy) if legacy is not None else None
        samples = read_jsonl(cfg.output / SAMPLES_FILE).records
        if recorded is None and samples and torn:
            log.warning(
                "nothing says which model, layers and settings the %d samples already in %s came from (identity.json "
                "torn, no data_config.json): every row is redone", len(samples), cfg.output
            )
            forget_every_row(cfg.output)
        elif recorded is None and samples:
            raise OutputError(
                f"output {cfg.output} holds samples but no identity.json (deleted, or written by an older hsextract "
                "that did not finish), so nothing says which model, layers and settings they came from. Restore "
                "identity.json, or use a new --output"
            )
    identity, notes = reconcile_identity(cfg.output, recorded, current)
    for note in notes:
        log.warning("%s", note)
    write_identity(cfg.output, identity)
    return identity


def _refuse_mixed_storage(cfg: ExtractConfig, recorded: OutputIdentity | None, stored: str | None) -> None:
    """FP8 and model-dtype rows never share an output (a trainer reads one storage per output)."""
    if recorded is None or recorded.stored_dtype is None:
        return
    was_fp8 = recorded.stored_dtype == FP8_STORAGE
    if was_fp8 != cfg.fp8:
        fix = f"pass --storage {FP8_STORAGE}" if was_fp8 else "drop --storage (or pass --storage auto)"
        raise IdentityMismatchError(
            f"output {cfg.output} stores {recorded.stored_dtype} states but this run would store "
            f"{stored or 'the model dtype'}: FP8 and unquantized rows never share an output. Nothing "
            f"was sent; {fix} to resume it, or use a new --output (what the output holds: {cfg.output / IDENTITY_FILE})"
        )


def check_disk(setup: RunSetup, plan: Plan, metrics: ExtractMetrics) -> None:
    """Free space on the output filesystem against the estimated output size."""
    cfg, fmt, identity = setup.config, setup.fmt, setup.identity
    assert identity is not None, "check_disk runs once the identity is recorded"
    # a server that does not report its dtype: estimated as bfloat16 until the first dump says
    stored = identity.stored_dtype or fmt.stored_dtype_for(identity.dtype) or "bfloat16"
    per_token = fmt.bytes_per_token(len(identity.aux_layer_ids), identity.hidden_size, stored)  # ConfigError: unknown dtype
    needed = int(plan.todo_tokens * per_token * cfg.disk_headroom)
    free = shutil.disk_usage(cfg.output).free
    metrics.planned_tokens.set(plan.todo_tokens)
    log.info(
        "plan%s: %d rows in this shard, %d already settled, %d to extract (%d tokens x %d bytes as %s: about %.2f GB; "
        "%.2f GB free)",
        "" if plan.exact else " (estimated from the first rows; counted exactly while the run goes)",
        plan.rows_in_shard,
        plan.settled,
        plan.todo_rows,
        plan.todo_tokens,
        per_token,
        stored,
        needed / 1e9,
        free / 1e9,
    )
    if plan.exact:
        log_lengths(cfg, plan)
    if needed > free:
        raise DiskSpaceError(
            f"output {cfg.output} has {free / 1e9:.2f} GB free but this run needs about {needed / 1e9:.2f} GB "
            f"({plan.todo_tokens} tokens x {per_token} bytes x {cfg.disk_headroom}); free space or choose "
            "another --output"
        )


def log_lengths(cfg: ExtractConfig, plan: Plan) -> None:
    """Truncation and the longest sample, against the trainer's default length."""
    log.info(
        "plan: %d of them longer than max_seq_len %d (truncated and counted); the longest sample will have %d tokens",
        plan.truncated_rows,
        cfg.max_seq_len,
        plan.longest_tokens,
    )
    if plan.over_trainer_default:
        fmt = format_class(cfg.format)
        log.warning(
            "plan: %d samples are longer than %s's default %s %d and would lose their tail there: train with %s %d "
            "(recorded in data_config.json)",
            plan.over_trainer_default,
            fmt.trainer_name,
            fmt.trainer_length_setting,
            fmt.trainer_default_length,
            fmt.trainer_length_setting,
            plan.longest_tokens,
        )
