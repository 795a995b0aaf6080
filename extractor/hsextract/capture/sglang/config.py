"""Options of ``hsextract launch-sglang`` (:class:`SGLangLaunchConfig`): the launcher's side of the
configuration, the YAML the Ansible role renders."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from hsextract.config import IntList, RidPrefix, StrictConfig
from hsextract.contract import defaults
from hsextract.contract.layers import DEFAULT_AUX_LAYERS_TEXT, LAYER_IDS_HELP


class SGLangLaunchConfig(StrictConfig):
    """Options of ``hsextract launch-sglang`` (the YAML the Ansible role renders)."""

    profile: Literal["extract", "generate"] = Field(
        "extract",
        description="extract: the dump hook, aux capture, radix cache off (hidden-state extraction); generate: a plain "
        "generation server for hsextract regenerate (radix cache kept, no hook, no aux capture; dump settings refused)",
    )
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
    disable_radix_cache: bool | None = Field(
        None,
        description="unset: the profile's (extract: true, and it must stay true: a cached prefix is never recomputed nor "
        "dumped; generate: false, a shared prefix is computed once)",
    )
    dump_dir: str = Field(defaults.DUMP_DIR, description="dump root (tmpfs) the extractor reads")
    rid_prefix: RidPrefix = Field(defaults.RID_PREFIX, description="only rids <prefix>-<row>-n<tokens> are dumped")
    layer_ids: IntList | None = Field(
        None, description=f"aux layers, {LAYER_IDS_HELP} (default: the {DEFAULT_AUX_LAYERS_TEXT})"
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
