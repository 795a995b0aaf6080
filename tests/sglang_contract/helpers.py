"""Shared code of the contract tests against the real sglang==0.5.23 package on CPU (run in .venv-sglang).

The hook is registered with SGLang's own ``register_forward_hooks`` on a real ``LogitsProcessor``
and driven with real ``ForwardBatch`` objects, as the model runner does.
"""

from __future__ import annotations

import json
import logging
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

warnings.filterwarnings("ignore")

from sglang.srt.layers.logits_processor import LogitsProcessor  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.hook_manager import register_forward_hooks  # noqa: E402
from sglang.srt.runtime_context import get_parallel, publish  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

from hsextract.capture.sglang import hook as sglang_hook  # noqa: E402

VOCAB, H = 256, 16


@pytest.fixture(scope="session")
def published_server_args(tmp_path_factory: pytest.TempPathFactory) -> None:
    """LogitsProcessor reads the process-wide server args: resolve and publish CPU ones."""
    model = tmp_path_factory.mktemp("config-only-model")
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
                "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
                "num_hidden_layers": 8, "vocab_size": VOCAB, "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6, "torch_dtype": "float32",
            }
        )
    )  # fmt: skip
    args = prepare_server_args(["--model-path", str(model), "--skip-tokenizer-init", "--device", "cpu"])
    logging.disable(logging.NOTSET)
    args.resolve_once()
    publish(args, role="scheduler")


class TinyServedModel(nn.Module):
    """The module names SGLang models have: ``logits_processor`` and ``model.norm``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.norm = _FusedAddNorm()
        self.logits_processor = LogitsProcessor(types.SimpleNamespace(vocab_size=VOCAB))
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(torch.randn(VOCAB, H))


class _FusedAddNorm(nn.Module):
    """SGLang's RMSNorm(x, residual) signature: returns (norm(x + residual), x + residual)."""

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = hidden + residual
        return total / total.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), total


def extend_batch(rids: list[str], prefix_lens: list[int], lens: list[int], padding: int = 0) -> ForwardBatch:
    n = sum(lens)
    ext = torch.tensor(lens, dtype=torch.int32)
    pre = torch.tensor(prefix_lens, dtype=torch.int32)
    seq = pre + ext
    start = torch.zeros(len(rids), dtype=torch.int32)
    start[1:] = torch.cumsum(ext, 0)[:-1]
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(rids),
        input_ids=torch.randint(0, VOCAB, (n + padding,)),
        req_pool_indices=torch.arange(len(rids)),
        seq_lens=seq,
        out_cache_loc=torch.arange(n + padding),
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq.clone(),
        positions=torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, lens, strict=True)]),
        rids=list(rids),
        extend_num_tokens=n,
        extend_seq_lens=ext,
        extend_prefix_lens=pre,
        extend_start_loc=start,
        extend_seq_lens_cpu=list(lens),
        extend_prefix_lens_cpu=list(prefix_lens),
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )


def decode_batch(rids: list[str], seq_lens: list[int]) -> ForwardBatch:
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(rids),
        input_ids=torch.zeros(len(rids), dtype=torch.int64),
        req_pool_indices=torch.arange(len(rids)),
        seq_lens=seq,
        out_cache_loc=torch.arange(len(rids)),
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq.clone(),
        positions=seq.long() - 1,
        rids=list(rids),
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )


class Served:
    """A model with the hook registered by SGLang, and a way to run one forward through it."""

    def __init__(self, dump_dir: Path, specs: list[dict[str, Any]]) -> None:
        self.dump_dir = dump_dir
        self.model = TinyServedModel()
        register_forward_hooks(self.model, specs)

    def forward(self, batch: ForwardBatch, hidden: torch.Tensor, aux: Any, residual: torch.Tensor | None = None) -> Any:
        with get_parallel().override(tp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0, pp_rank=0):
            if residual is not None:
                hidden, _ = self.model.model.norm(hidden, residual)  # type: ignore[operator]  # an nn.Module attribute
            return self.model.logits_processor(batch.input_ids, hidden, self.model.lm_head, batch, aux)

    def flush(self) -> None:
        sglang_hook._DUMPERS[self.dump_dir].sink.flush()


@pytest.fixture
def served(published_server_args: None, tmp_path: Path) -> Iterator[Any]:
    made: list[Path] = []

    def make(specs: list[dict[str, Any]]) -> Served:
        dump_dir = Path(specs[0]["config"]["dump_dir"])
        made.append(dump_dir)
        return Served(dump_dir, specs)

    yield make
    for dump_dir in made:
        dumper = sglang_hook._DUMPERS.pop(dump_dir, None)
        if dumper is not None:
            dumper.sink.flush()
            dumper.sink.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.sglang)
