"""Typed configuration: the single source of every ``extract`` and ``serve`` option.

Each field is a CLI flag (``--max-seq-len``) and a key of the YAML file given with ``--config``
(``max_seq_len``); the flag wins over the file. Unknown keys are refused, so a typo in the file
rendered by Ansible stops the run before any work starts.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hsextract.contract import defaults
from hsextract.contract.layers import DEFAULT_AUX_LAYERS_TEXT
from hsextract.contract.rids import check_prefix
from hsextract.errors import ConfigError
from hsextract.extract.formats import DEFAULT_FORMAT, FORMAT_NAMES

if TYPE_CHECKING:
    FormatName = str
else:
    #: the output formats' names, from their registry (hsextract.extract.formats): one choice per format
    FormatName = Literal[FORMAT_NAMES]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _valid_prefix(value: str) -> str:
    try:
        return check_prefix(value)
    except ConfigError as exc:  # pydantic reports ValueErrors as validation errors
        raise ValueError(str(exc)) from None


#: a rid prefix: 1-32 letters or digits (it becomes part of a path)
RidPrefix = Annotated[str, AfterValidator(_valid_prefix)]


class ExtractConfig(_Strict):
    """Options of ``hsextract extract``."""

    server: str = Field(f"http://127.0.0.1:{defaults.SERVER_PORT}", description="base URL of the SGLang or embedded server")
    dataset: Path = Field(description="tokenized dataset: .jsonl, .parquet, or a datasets.save_to_disk directory")
    output: Path = Field(description="output directory (created; a rerun resumes into it)")
    dump_dir: Path | None = Field(
        None, description="where the server writes dumps (default: the one the server reports in /server_info)"
    )
    format: FormatName = Field(DEFAULT_FORMAT, description="output layout: " + ", ".join(FORMAT_NAMES))
    storage: Literal["auto", "float8_e4m3fn"] = Field(
        "auto",
        description="how the hidden states are stored: auto, the model's dtype (specforge: bfloat16); float8_e4m3fn, FP8 "
        "with one float32 scale per token as hs-connectors 0.9.0 (speculators format only; train with "
        "--hidden-states-backend fp8): half the bytes",
    )
    layer_ids: list[int] | None = Field(
        None, description=f"aux layer ids, 0-based outputs (default: the server's, else the {DEFAULT_AUX_LAYERS_TEXT})"
    )
    architecture: Literal["auto", "deepseek", "llama", "qwen2"] = Field(
        "auto",
        description="model family, for the SGLang draft-config value that serves these layers (auto: from config.json)",
    )
    max_seq_len: int = Field(4096, gt=0, description="longer prompts are truncated to this many tokens and counted")
    concurrency: int = Field(
        256, gt=0, le=1024, description="requests in flight at once (the server batches among those waiting)"
    )
    sort_window: int = Field(
        2048, gt=0, description="rows read ahead and sent shortest first, so batches carry little padding (1: dataset order)"
    )
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve Prometheus metrics on this port (0 or unset: off)")
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics endpoint binds to (0.0.0.0 to let another host scrape it)"
    )
    shard_index: int = Field(0, ge=0, description="this node's slice: rows with row %% num_shards == shard_index")
    num_shards: int = Field(1, gt=0, description="number of slices the dataset is split into")
    vocab_size: int | None = Field(None, gt=0, description="override the vocabulary size used to reject bad ids")
    rid_prefix: RidPrefix = Field(defaults.RID_PREFIX, description="prefix of the request ids the server dumps")
    shm_high_water: float = Field(
        0.85, gt=0, le=1, description="stop submitting while the dump filesystem is fuller than this fraction"
    )
    shm_wait_timeout_s: float = Field(
        600.0, gt=0, description="stop the run when the dump filesystem stays that full this long with nothing in flight"
    )
    resume_check: Literal["checksum", "size"] = Field(
        "checksum",
        description="how a resume checks samples already written: checksum re-reads every file, size only stats it",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="HTTP timeout of one /generate request")
    dump_timeout_s: float = Field(300.0, gt=0, description="how long to wait for a dump after its request returned")
    answer_grace_s: float = Field(
        2.0,
        ge=0,
        description="once a row's dump is complete, how long its HTTP answer may still take before the row goes on without it",
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="watchdog: when no row settled for this long while requests are open, log them and resend those "
        "the server has no trace of",
    )
    health_timeout_s: float = Field(120.0, ge=0, description="how long to wait for the server's HTTP 200 at start")
    server_down_timeout_s: float = Field(
        1800.0,
        ge=0,
        description="mid-run, how long to wait for a server that stopped taking connections (a restart: a Kimi-size "
        "model loads in 15-25 min) before the run stops; no row is failed meanwhile",
    )
    max_attempts: int = Field(3, gt=0, description="tries per sample before it is recorded as failed")
    max_consecutive_failures: int = Field(
        8, gt=0, description="stop the run after this many samples in a row failed after all their tries"
    )
    disk_headroom: float = Field(1.05, ge=1.0, description="required free disk = estimated output bytes x this")
    expect_model: str | None = Field(None, description="refuse to run unless the server's model path ends with this string")
    log_interval_s: float = Field(30.0, gt=0, description="seconds between progress log lines when not on a terminal")

    @field_validator("server")
    @classmethod
    def _server(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"server {value!r} must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _shards(self) -> ExtractConfig:
        if self.shard_index >= self.num_shards:
            raise ValueError(f"shard_index {self.shard_index} must be below num_shards {self.num_shards}")
        return self

    @model_validator(mode="after")
    def _storage(self) -> ExtractConfig:
        # the format owns what it can store; a ConfigError (not a validation error) carries its own fix
        from hsextract.extract.formats import format_class

        format_class(self.format).check_storage(self.storage)
        return self

    @property
    def fp8(self) -> bool:
        return self.storage != "auto"


class ServeConfig(_Strict):
    """Options of ``hsextract serve`` (the embedded transformers server)."""

    model: Path = Field(description="a transformers save_pretrained directory")
    dump_dir: Path = Field(description="dump root (put it on tmpfs, e.g. /dev/shm/hsextract)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(defaults.SERVER_PORT, ge=1, le=65535, description="port to listen on")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the model runs")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="model dtype (auto: the model's)")
    layer_ids: list[int] | None = Field(
        None, description=f"aux layer ids, 0-based outputs (default: the {DEFAULT_AUX_LAYERS_TEXT})"
    )
    chunked_prefill_size: int = Field(
        2048, description="prompts longer than this are prefilled in chunks on the KV cache (-1: never)"
    )
    max_batch_tokens: int = Field(8192, gt=0, description="token budget of one batched forward (padded)")
    rid_prefix: RidPrefix = Field(defaults.RID_PREFIX, description="only rids <prefix>-<row>-n<tokens> are dumped")
    dump_queue_size: int = Field(8, gt=0, description="extend batches waiting for the dump writers before forwards block")
    dump_writers: int = Field(4, gt=0, le=64, description="threads writing dumps in parallel")
    batch_window: int = Field(
        1024, gt=0, description="oldest waiting prompts a batch is chosen from (length-sorted around the oldest)"
    )
    max_total_tokens: int = Field(
        32768,
        gt=1,
        description="KV token budget of generation (max_new_tokens > 0), padding included: requests beyond it wait",
    )
    max_running_requests: int = Field(128, gt=0, description="generation requests decoding together at most")

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk(cls, value: int) -> int:
        if value != -1 and value < 16:
            raise ValueError(f"chunked_prefill_size {value} must be -1 (off) or at least 16")
        return value


class SGLangLaunchConfig(_Strict):
    """Options of ``hsextract launch-sglang`` (the YAML the Ansible role renders)."""

    python: str = Field(defaults.ML_ENV_PYTHON, description="absolute path of the ml-env interpreter that has sglang")
    model_path: str = Field(description="model directory as the server sees it")
    architecture: Literal["auto", "deepseek", "llama", "qwen2"] = Field(
        "auto", description="how SGLang numbers aux layers for this model (auto: from config.json)"
    )
    num_hidden_layers: int | None = Field(None, gt=0, description="layer count (default: read from the model's config.json)")
    tp_size: int = Field(1, gt=0, description="tensor parallel size")
    dp_size: int = Field(1, gt=0, description="data parallel size (with enable_dp_attention: attention DP groups)")
    enable_dp_attention: bool = Field(False, description="attention data parallelism")
    host: str = Field("127.0.0.1", description="address the server listens on")
    port: int = Field(defaults.SERVER_PORT, ge=1, le=65535, description="port the server listens on")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="SGLang's static memory fraction")
    chunked_prefill_size: int = Field(8192, description="tokens per extend pass (-1: no chunking); the hook assembles chunks")
    disable_radix_cache: bool = Field(True, description="must stay true: a cached prefix is never recomputed nor dumped")
    dump_dir: str = Field(defaults.DUMP_DIR, description="dump root (tmpfs) the extractor reads")
    rid_prefix: RidPrefix = Field(defaults.RID_PREFIX, description="only rids <prefix>-<row>-n<tokens> are dumped")
    layer_ids: list[int] | None = Field(
        None, description=f"aux layer ids, 0-based outputs (default: the {DEFAULT_AUX_LAYERS_TEXT})"
    )
    final_prenorm: bool = Field(False, description="also dump the final layer's pre-norm output (speculators format)")
    storage: Literal["float8_e4m3fn"] | None = Field(
        None,
        description="float8_e4m3fn: the hook quantizes every dump per token on the GPU into speculators' FP8 layout "
        "(half the bytes in /dev/shm and over PCIe); unset: the model's dtype. Every dump's meta.json says which",
    )
    disable_custom_all_reduce: bool = Field(
        False,
        description="pass --disable-custom-all-reduce: NCCL all-reduce only. Custom all-reduce needs CUDA IPC between "
        "the GPUs, which an LXC container's device passthrough may not allow; keep it on (false) on bare metal with NVLink",
    )
    enable_metrics: bool = Field(True, description="SGLang's own Prometheus /metrics")
    trust_remote_code: bool = Field(True, description="pass --trust-remote-code (Kimi-K2.5 needs it)")
    hook_queue_size: int = Field(4, gt=0, description="extend batches waiting for the dump writers before the forward waits")
    hook_dump_writers: int = Field(4, gt=0, le=64, description="threads of the hook writing dumps in parallel")
    extra_args: list[str] = Field(default_factory=list, description="further SGLang flags, checked against the refused list")
    nnodes: int = Field(1, gt=0, description="nodes one server spans (SGLang --nnodes); tp_size counts all their GPUs")
    node_rank: int = Field(0, ge=0, description="this node's rank, 0..nnodes-1; node 0 serves HTTP and writes the dumps")
    dist_init_addr: str | None = Field(
        None, description="host:port of node 0 that every node reaches (SGLang --dist-init-addr); needed when nnodes > 1"
    )

    @field_validator("python")
    @classmethod
    def _absolute_python(cls, value: str) -> str:
        if not os.path.isabs(value):
            raise ValueError(
                f"python {value!r} is not an absolute path; give the ml-env interpreter by absolute path "
                "(a bare python3 once started the server without SGLang's dev install)"
            )
        return value


def _flag_type(annotation: Any) -> tuple[dict[str, Any], str]:
    """argparse keyword arguments for a field's annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if origin is Literal:
        return {"choices": list(args)}, ""
    if origin is list:
        return {"type": _int_list}, "N,N,..."
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}, ""
    if annotation in (int, float):
        return {"type": annotation}, ""
    return {"type": str}, ""


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], positional: tuple[str, ...] = ()) -> None:
    """One flag per field (positional for ``positional``), defaults left to the model."""
    parser.add_argument("--config", type=Path, help="YAML file with any of these options (flags override it)")
    for name, field in model.model_fields.items():
        kwargs, metavar = _flag_type(field.annotation)
        default = "" if field.is_required() else f" (default: {field.default})"
        help_text = (field.description or "") + default
        if name in positional:
            parser.add_argument(name, nargs="?", default=argparse.SUPPRESS, help=help_text, **kwargs)
            continue
        if metavar:
            kwargs["metavar"] = metavar
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS, help=help_text, **kwargs)


def load_config(model: type[_Strict], args: argparse.Namespace) -> Any:
    """Merge the YAML file (if any) with the flags given, and validate."""
    data: dict[str, Any] = {}
    config_path: Path | None = getattr(args, "config", None)
    if config_path is not None:
        try:
            loaded = yaml.safe_load(Path(config_path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {config_path} does not exist; fix --config") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {config_path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_path} must hold a mapping of option: value")
        data.update(loaded or {})
    for name in model.model_fields:
        if name in vars(args):
            data[name] = vars(args)[name]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "config"
            flag = "--" + where.replace("_", "-")
            if error["type"] == "missing":
                problems.append(f"{where} ({flag}) is required; set it")
            else:
                problems.append(f"{where} ({flag}): {error['msg']} (got {error.get('input')!r})")
        source = f" in {config_path} or on the command line" if config_path else ""
        raise ConfigError("invalid configuration" + source + ": " + "; ".join(problems)) from None
