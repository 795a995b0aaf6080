"""Options of ``hsextract extract`` (:class:`ExtractConfig`): the extractor's side of the configuration.

Each field is a CLI flag and a key of the YAML file given with ``--config`` (:mod:`hsextract.config`
turns the model into flags and loads the file).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from hsextract.config import IntList, RidPrefix, StrictConfig
from hsextract.contract import defaults
from hsextract.contract.layers import DEFAULT_AUX_LAYERS_TEXT, LAYER_IDS_HELP
from hsextract.errors import ConfigError
from hsextract.output.formats import DEFAULT_FORMAT, FORMAT_NAMES
from hsextract.output.sample_file import OutputIO

#: pack processes (``pack_processes`` unset) only for runs with this many rows to do: the row threads keep up with a
#: shorter run
PACK_PROCESSES_FROM_ROWS = 512
#: rows_per_request's default (bench/results-row-cost.json, "rows_per_request")
ROWS_PER_REQUEST = 16

if TYPE_CHECKING:
    FormatName = str
else:
    #: the output formats' names, from their registry (hsextract.output.formats): one choice per format
    FormatName = Literal[FORMAT_NAMES]


def preparation_format(dataset: Path) -> str | None:
    """The ``--like`` a dataset directory was prepared with (its ``prepare.json``); None for any other dataset."""
    from hsextract.prepare.provenance import read_provenance

    provenance = read_provenance(dataset) if dataset.is_dir() else None
    return None if provenance is None else provenance.settings.like


def format_clash(format_name: str, prepared_like: str, dataset: Path) -> str:
    """The refusal of an output format other than the trainer a dataset was prepared for."""
    return (
        f"--format {format_name} but {dataset} was prepared --like {prepared_like} (its prepare.json): its rows and "
        f"loss masks are {prepared_like}'s, so a {format_name} output would train on another tokenization. Drop --format "
        f"(it then follows prepare.json), or prepare the conversations again with --like {format_name}"
    )


class ExtractConfig(StrictConfig):
    """Options of ``hsextract extract``."""

    server: str = Field(f"http://127.0.0.1:{defaults.SERVER_PORT}", description="base URL of the SGLang or embedded server")
    dataset: Path = Field(description="tokenized dataset: .jsonl, .parquet, or a datasets.save_to_disk directory")
    output: Path = Field(description="output directory (created; a rerun resumes into it)")
    dump_dir: Path | None = Field(
        None, description="where the server writes dumps (default: the one the server reports in /server_info)"
    )
    format: FormatName = Field(
        DEFAULT_FORMAT,
        description="output layout: " + ", ".join(FORMAT_NAMES) + " (default: the --like of a dataset hsextract "
        f"prepare made, else {DEFAULT_FORMAT})",
    )
    storage: Literal["auto", "float8_e4m3fn"] = Field(
        "auto",
        description="how the hidden states are stored: auto, the model's dtype (specforge: bfloat16); float8_e4m3fn, FP8 "
        "with one float32 scale per token as hs-connectors 0.9.0 (speculators format only; train with "
        "--hidden-states-backend fp8): half the bytes",
    )
    layer_ids: IntList | None = Field(
        None, description=f"aux layers, {LAYER_IDS_HELP} (default: the server's, else the {DEFAULT_AUX_LAYERS_TEXT})"
    )
    architecture: Literal["auto", "deepseek", "llama", "qwen2"] = Field(
        "auto",
        description="model family, for the SGLang draft-config value that serves these layers (auto: from config.json)",
    )
    max_seq_len: int = Field(4096, gt=0, description="longer prompts are truncated to this many tokens and counted")
    require_loss_mask: bool = Field(
        False,
        description="a row without loss_mask is bad input (by default it is taken with every token supervised, "
        "prompts included, and counted)",
    )
    concurrency: int = Field(
        256,
        gt=0,
        le=1024,
        description="rows in flight at once, each with its request open (the server batches among those waiting)",
    )
    rows_per_request: int = Field(
        ROWS_PER_REQUEST,
        ge=1,
        le=256,
        description="rows one /generate carries at most (SGLang's batched form): rows sent while every request slot is "
        "out (a quarter of --concurrency in full requests) go together, so short rows cost both sides less; a lone "
        "row goes at once (1: a request a row)",
    )
    pack_processes: int | None = Field(
        None,
        ge=0,
        le=64,
        description="processes that read, check and write the dumps beside the request threads, each with its own "
        "interpreter lock: forks of the run's process (hsextract-pack in ps and top), each holding two rows "
        f"(0: on the request threads; default: a quarter of the CPUs, 1 to 8, for runs of {PACK_PROCESSES_FROM_ROWS} "
        "rows or more, else 0)",
    )
    output_io: OutputIO = Field(
        "buffered",
        description="how sample files are written: buffered (the page cache), direct (O_DIRECT from a staging buffer: "
        "no page cache, no write-back, less of the packer's CPU, but the disk's latency inside a packing turn), or auto: "
        "direct on a local disk filesystem (ext4, xfs, btrfs, f2fs), buffered elsewhere (tmpfs, NFS, FUSE). Buffered "
        "by default: faster end to end on a GPU host's disk (bench/results-gpu-e2e-pages-io.json)",
    )
    sort_window: int = Field(
        2048,
        gt=0,
        description="rows read ahead and sent shortest first, so batches carry little padding (1: dataset order); the "
        "first blocks are smaller (32, 64, ...), so the first request leaves at once",
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
    spot_check_every: int = Field(
        defaults.SPOT_CHECK_EVERY,
        ge=0,
        description="every Nth row sent is asked once more with the engine's own hidden states returned (SGLang's "
        "return_hidden_states; no dump) and compared with its dump (docs/spot-check.md); 0: off",
    )
    spot_check_max_tokens: int = Field(
        defaults.SPOT_CHECK_MAX_TOKENS,
        gt=0,
        description="a spot check sends at most this many of the row's first tokens (the answer is JSON: about 0.4 MB "
        "per token for Kimi-K2.5)",
    )
    spot_check_max_mismatches: int = Field(
        3, gt=0, description="stop the run after this many spot-checked rows differed from their dumps"
    )
    spot_check_margin: float = Field(
        defaults.SPOT_CHECK_MARGIN,
        gt=1.0,
        description="a spot-checked tensor matches when the dump is this many times closer to the engine's state than "
        "that state is to its nearest alternative (another captured layer, the same layer a token off); norm-wise, "
        "median over the checked positions (docs/spot-check.md)",
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

    @model_validator(mode="before")
    @classmethod
    def _format_of_the_preparation(cls, data: Any) -> Any:
        """A dataset ``prepare`` made was tokenized for one trainer (its ``prepare.json`` ``like``): without a format
        the output is that trainer's, and another format is refused naming both."""
        if not isinstance(data, dict) or data.get("dataset") is None:
            return data
        prepared_like = preparation_format(Path(data["dataset"]))
        if prepared_like is None:
            return data
        given = data.get("format")
        if given is None:
            return {**data, "format": prepared_like}
        if given != prepared_like:
            raise ConfigError(format_clash(given, prepared_like, Path(data["dataset"])))
        return data

    @model_validator(mode="after")
    def _shards(self) -> ExtractConfig:
        if self.shard_index >= self.num_shards:
            raise ValueError(
                f"shard_index {self.shard_index} (--shard-index) must be below num_shards {self.num_shards} "
                f"(--num-shards): give --shard-index 0 to {self.num_shards - 1}, or raise --num-shards"
            )
        return self

    @model_validator(mode="after")
    def _storage(self) -> ExtractConfig:
        # the format owns what it can store; a ConfigError (not a validation error) carries its own fix
        from hsextract.output.formats import format_class

        format_class(self.format).check_storage(self.storage)
        return self

    @property
    def fp8(self) -> bool:
        return self.storage != "auto"

    def prefill_posts(self) -> int:
        """Prefill POSTs out at once. With one row a request, every row's goes at once (as many as rows in flight);
        with more, a quarter of the rows in flight in full POSTs, at least 2: rows sent while every slot is out
        join a POST that waits for the next free one (or goes once full), so under load each carries several
        (``make bench-row-cost``: 4 slots at 256 rows in flight filled POSTs to 10 rows, 16 slots to 2.6)."""
        if self.rows_per_request == 1:
            return self.concurrency
        return max(2, -(-self.concurrency // (4 * self.rows_per_request)))

    def pack_processes_for(self, rows_to_do: int) -> int:
        """The pack processes of a run with ``rows_to_do`` rows: as set, else a quarter of the CPUs this process may
        run on (1 to 8) for a run of :data:`PACK_PROCESSES_FROM_ROWS` rows or more, else none."""
        if self.pack_processes is not None:
            return self.pack_processes
        if rows_to_do < PACK_PROCESSES_FROM_ROWS:
            return 0
        return max(1, min(8, len(os.sched_getaffinity(0)) // 4))
