"""``RegenerateConfig``: the single source of every ``hsextract regenerate`` option (flag and YAML key)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hsextract.config import StrictConfig
from hsextract.contract import defaults

#: what ``--reasoning`` does with a reasoning model's ``<think>...</think>`` block (docs/data.md)
REASONING_HELP = (
    "a reasoning model's <think>...</think> block: keep (default) leaves it in the answer as the model wrote it, so "
    "the drafter learns the tokens the target really emits, thinking included; drop removes it; split moves it to "
    "reasoning_content beside content (SpecForge's --reasoning save), for a thinking chat template that renders it"
)


def shard_rows(shard_index: int, num_shards: int, rows: int) -> range:
    """The rows of shard ``shard_index`` of ``num_shards`` in an input of ``rows`` rows: row % num_shards == index."""
    return range(shard_index, rows, num_shards)


class RegenerateConfig(StrictConfig):
    """Options of ``hsextract regenerate``."""

    server: str = Field(f"http://127.0.0.1:{defaults.SERVER_PORT}", description="base URL of the SGLang or embedded server")
    dataset: Path = Field(description="conversations (ShareGPT or messages): .jsonl, .parquet, or a save_to_disk directory")
    output: Path = Field(
        description="the regenerated conversations: .jsonl, or .parquet (progress is kept in OUTPUT.journal/ meanwhile)"
    )
    model: Path | None = Field(
        None,
        description="model directory whose tokenizer and chat template render the prompts and decode the answers "
        "(default: the server's model_path, when it is a directory here)",
    )
    chat_template: Path | None = Field(None, description="a Jinja chat template file replacing the model's own")
    trust_remote_code: bool = Field(False, description="let transformers run the model's own tokenizer code (Kimi needs it)")
    split: str | None = Field(None, description="the split of a DatasetDict directory")
    max_new_tokens: int = Field(2048, gt=0, description="most tokens generated per turn; a turn cut there is marked length")
    temperature: float = Field(
        0.0,
        ge=0,
        description="sampling temperature; 0 is greedy (the default: the target's most likely answer, the same on "
        "every rerun and on any server)",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: keep the most likely tokens up to this mass")
    top_k: int = Field(-1, description="sample among the k most likely tokens (-1: all)")
    seed: int | None = Field(
        None,
        description="per-request sampling seed (SGLang's sampling_seed; SGLang honours it only with "
        "--enable-deterministic-inference); each turn's seed is derived from it, its row and turn",
    )
    turns: Literal["all", "last"] = Field(
        "all", description="regenerate every assistant turn (each on the history of the answers before it) or the last"
    )
    reasoning: Literal["keep", "drop", "split"] = Field("keep", description=REASONING_HELP)
    enable_thinking: bool | None = Field(
        None, description="pass enable_thinking to the chat template (Qwen3-style templates; unset: the template's default)"
    )
    drop_truncated: bool = Field(False, description="drop a row any of whose turns was cut by max_new_tokens (counted)")
    concurrency: int = Field(64, gt=0, le=1024, description="conversations in flight at once (one request each)")
    request_timeout_s: float = Field(1800.0, gt=0, description="HTTP timeout of one /generate request")
    health_timeout_s: float = Field(120.0, ge=0, description="how long to wait for the server's HTTP 200 at start")
    server_down_timeout_s: float = Field(
        1800.0, ge=0, description="mid-run, how long to wait for a server that stopped taking connections (a restart)"
    )
    max_attempts: int = Field(5, gt=0, description="tries per request on transient server errors (backoff between)")
    retry_backoff_s: float = Field(1.0, ge=0, description="first wait before a retry; doubled each time, at most 60 s")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve Prometheus metrics on this port (0 or unset: off)")
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics endpoint binds to (0.0.0.0 to let another host scrape it)"
    )
    shard_index: int = Field(
        0, ge=0, description="this host's slice: the rows with row %% num_shards == shard_index (hsextract "
        "merge-regenerated joins the slices in input order)"
    )
    num_shards: int = Field(1, gt=0, description="number of slices the input is split into")
    progress: bool = Field(True, description="show a progress bar")

    @field_validator("server")
    @classmethod
    def _server(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"server {value!r} must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("output")
    @classmethod
    def _output(cls, value: Path) -> Path:
        if value.suffix not in (".jsonl", ".parquet"):
            raise ValueError(f"output {str(value)!r} must end in .jsonl or .parquet")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError(f"top_k {value} must be -1 (all tokens) or at least 1")
        return value

    @model_validator(mode="after")
    def _greedy_seed(self) -> RegenerateConfig:
        if self.seed is not None and self.temperature == 0:
            raise ValueError("seed is given but temperature is 0 (greedy: nothing is sampled); drop seed or set temperature")
        return self

    @model_validator(mode="after")
    def _shards(self) -> RegenerateConfig:
        if self.shard_index >= self.num_shards:
            raise ValueError(f"shard_index {self.shard_index} must be below num_shards {self.num_shards}")
        return self

    def shard_rows(self, rows: int) -> range:
        """The input rows this run regenerates (all of them unless the input is sharded)."""
        return shard_rows(self.shard_index, self.num_shards, rows)

    @property
    def journal_dir(self) -> Path:
        return self.output.with_name(self.output.name + ".journal")

    def sampling(self) -> dict[str, object]:
        """The sampling settings every request carries (recorded in the identity and in every row)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }
