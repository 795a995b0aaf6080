"""Options of ``hsextract serve`` (:class:`ServeConfig`): the embedded engine's side of the configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hsextract.config import IntList, RidPrefix, StrictConfig
from hsextract.contract import defaults
from hsextract.contract.layers import DEFAULT_AUX_LAYERS_TEXT, LAYER_IDS_HELP


class ServeConfig(StrictConfig):
    """Options of ``hsextract serve`` (the embedded transformers server)."""

    model: Path = Field(description="a transformers save_pretrained directory")
    dump_dir: Path = Field(description="dump root (put it on tmpfs, e.g. /dev/shm/hsextract)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(defaults.SERVER_PORT, ge=1, le=65535, description="port to listen on")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the model runs")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="model dtype (auto: the model's)")
    layer_ids: IntList | None = Field(None, description=f"aux layers, {LAYER_IDS_HELP} (default: the {DEFAULT_AUX_LAYERS_TEXT})")
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
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="run the batched prompt forwards as CUDA graphs, one per padded shape, on a GPU (auto: for models of "
        "at most 100 M parameters outside the embeddings, whose launch takes longer than their forward; see "
        "capture/embedded/forward_graphs.py)",
    )
    decode_kv: Literal["dynamic", "static"] = Field(
        "static",
        description="layout of the generation KV cache: static (buffers a step writes into, each row from column 0, "
        "reallocated only when the admitted rows outgrow them and kept between requests: the layout a CUDA graph can "
        "replay; see capture/embedded/static_kv.py) or dynamic (transformers' DynamicCache, rows padded on the left, "
        "every layer grown by a column a step)",
    )
    decode_graphs: bool = Field(
        True,
        description="on a GPU, replay the static layout's decode step as a CUDA graph, captured again only when the "
        "buffers are reallocated (see capture/embedded/step_graphs.py); no effect on the CPU or with --decode-kv dynamic",
    )
    cudnn_attention: bool = Field(
        False,
        description="let PyTorch pick its cuDNN attention kernel on a GPU (off by default: it builds an execution plan "
        "for every new shape and thread, which made decode steps 1.3 to 3.5x slower on an H200; see "
        "docs/design-notes.md)",
    )

    @model_validator(mode="after")
    def _graphs_need_the_static_layout(self) -> ServeConfig:
        if self.decode_graphs and self.decode_kv != "static" and "decode_graphs" in self.model_fields_set:
            raise ValueError("decode_graphs replays the step on fixed buffers: set decode_kv to static (--decode-kv static)")
        return self

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk(cls, value: int) -> int:
        if value != -1 and value < 16:
            raise ValueError(f"chunked_prefill_size {value} must be -1 (off) or at least 16")
        return value
