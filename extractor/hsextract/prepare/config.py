"""``PrepareConfig``: the single source of every ``hsextract prepare`` option (flag and YAML key)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from hsextract.config import StrictConfig
from hsextract.errors import ConfigError

#: the trainers whose tokenization prepare reproduces
CONVENTIONS = ("specforge", "speculators")
Like = Literal["specforge", "speculators"]


class PrepareConfig(StrictConfig):
    """Options of ``hsextract prepare``."""

    model: Path = Field(description="model directory: its tokenizer and chat template tokenize the conversations")
    dataset: Path = Field(description="conversations (ShareGPT or messages): .jsonl, .parquet, or a save_to_disk directory")
    output: Path = Field(description="the prepared dataset: a save_to_disk directory, with prepare.json and errors.jsonl")
    like: Like | None = Field(
        None, description="tokenize as this trainer's own preprocessing does: specforge or speculators (default: --format's)"
    )
    format: Like = Field(
        "specforge", description="the output format extract will write; picks --like when unset, and must be it when set"
    )
    chat_template: Path | None = Field(None, description="a Jinja chat template file replacing the model's own")
    specforge_template: str | None = Field(
        None,
        description="the SpecForge registry template (its system prompt and assistant span; default: the only one the "
        "model's template fits)",
    )
    max_seq_len: int = Field(4096, gt=0, description="longer rows are cut to this many tokens and counted")
    split: str | None = Field(None, description="the split of a DatasetDict directory")
    trust_remote_code: bool = Field(False, description="let transformers run the model's own tokenizer code (Kimi needs it)")
    chunk_rows: int = Field(1000, gt=0, description="input rows per part written; a rerun resumes after the last whole part")
    progress: bool = Field(True, description="show a progress bar")

    @model_validator(mode="after")
    def _format_follows_like(self) -> PrepareConfig:
        # a ConfigError, not a validation error: it carries its own fix (and exits 2 before any work)
        if self.like is not None and "format" in self.model_fields_set and self.format != self.like:
            raise ConfigError(
                f"--like {self.like} and --format {self.format} name two trainers: an output's format follows its "
                f"--like (extract writes the format of the trainer the rows were tokenized as). Nothing was done; drop "
                f"--format, or give --like {self.format} to tokenize as {self.format} does"
            )
        return self

    @property
    def convention(self) -> str:
        return self.like or self.format
