"""Shared code of the trainer tests: outputs of every supported architecture, in both formats.

Runs in .venv-trainers (``make setup-trainers``): the released ``specforge`` and ``speculators``
packages installed with ``--no-deps`` beside hsextract, never copied into this repository. Each
output is made the way a user makes one: a tiny model (``make-tiny-model``), the embedded server,
``hsextract extract`` with the defaults, over a dataset with a short row, a row longer than
``max_seq_len`` (truncated), a row longer than SpecForge's default ``max_length`` 2048, and a bad row.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hs_connectors import FileTransfer
from safetensors import safe_open
from specforge.algorithms.eagle3.data import build_offline_collator, build_offline_normalizer, build_offline_reader
from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
from specforge.runtime.data_plane.feature_store import LocalFeatureStore
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset
from speculators.train.dataloader import _setup_dataloader

from hsextract.dev.tiny_model import make_tiny_model
from hsextract.output.formats import open_format

from ..helpers import RunningServer, run_extraction

warnings.filterwarnings("ignore", category=DeprecationWarning)

VOCAB = 1024
MAX_SEQ_LEN = 2200
#: row lengths: short, short, longer than max_seq_len, bad (an id outside the vocabulary), longer than 2048
ROWS = [40, 130, 2500, "bad", 2100]
BAD_ROW = 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.trainers)


@dataclass(frozen=True)
class Output:
    arch: str
    format: str
    model: Path
    path: Path

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads((self.path / "data_config.json").read_text()))

    @property
    def written_rows(self) -> list[int]:
        return [json.loads(line)["row"] for line in (self.path / "samples.jsonl").read_text().splitlines()]


def write_dataset(path: Path) -> Path:
    rng = random.Random(11)
    with open(path, "w") as handle:
        for length in ROWS:
            if length == "bad":
                handle.write(json.dumps({"input_ids": [5, 6, VOCAB + 3]}) + "\n")
                continue
            assert isinstance(length, int)
            ids = [rng.randrange(VOCAB) for _ in range(length)]
            mask = [0] * (length // 3) + [1] * (length - length // 3)  # a prompt, then the answer
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    return path


def add_checkpoint_index(model: Path) -> None:
    """SpecForge's TargetHead finds lm_head through the checkpoint index multi-file checkpoints carry
    (Kimi-K2.5 has one); the single-file tiny model gets the same index, pointing at its one file."""
    with safe_open(str(model / "model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, "model.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="session")
def output(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    made: dict[tuple[str, str, str, str], Output] = {}
    models: dict[str, Path] = {}
    dataset = write_dataset(tmp_path_factory.mktemp("data") / "data.jsonl")

    def get(arch: str, fmt: str, layers: str = "default", storage: str = "auto") -> Output:
        key = (arch, fmt, layers, storage)
        if key not in made:
            if arch not in models:
                models[arch] = make_tiny_model(
                    tmp_path_factory.mktemp(f"model-{arch}"), arch=arch, layers=8, hidden=64, vocab_size=VOCAB
                )
                add_checkpoint_index(models[arch])
            layer_ids = None if layers == "default" else [int(i) for i in layers.split(",")]
            root = tmp_path_factory.mktemp(f"out-{arch}-{fmt}-{storage}")
            server = RunningServer.start(models[arch], root / "dumps", layer_ids=layer_ids)
            try:
                summary = run_extraction(
                    server.url,
                    dataset,
                    root / "out",
                    format=fmt,
                    max_seq_len=MAX_SEQ_LEN,
                    layer_ids=layer_ids,
                    storage=storage,
                )
            finally:
                server.stop()
            assert summary.status == "complete" and summary.bad_input == 1 and summary.truncated == 1
            made[key] = Output(arch, fmt, models[arch], root / "out")
        return made[key]

    yield get


def arrow_dataset(out: Output, total_seq_len: int, transfer: Any) -> ArrowDataset:
    """speculators' ArrowDataset as its training builds it from the flags data_config.json records."""
    flags = out.config["trainer"]["flags"]
    return ArrowDataset(
        max_len=total_seq_len, datapath=str(out.path / flags["--data-path"]), transfer=transfer, on_missing=flags["--on-missing"]
    )


def dataset_from_flags(out: Output, total_seq_len: int) -> ArrowDataset:
    """speculators' ArrowDataset over ``out`` with hs-connectors' FileTransfer, from the recorded flags."""
    return arrow_dataset(out, total_seq_len, FileTransfer(out.path / out.config["trainer"]["flags"]["--hidden-states-path"]))


def assert_multipack_collates_every_written_token(out: Output, dataset: ArrowDataset, unavailable: int = 1) -> None:
    """speculators' multipack loader (``_setup_dataloader``, ``shift_batch``) over ``dataset``: every batch
    full and finite bf16, every written token collated, ``unavailable`` rows (the bad one) counted as unavailable."""
    total, hidden = out.config["trainer"]["flags"]["--total-seq-len"], out.config["hidden_size"]
    loader = _setup_dataloader(
        dataset, total, hidden, num_workers=0, num_target_layers=3, prefetch_factor=None, preprocess=shift_batch
    )
    tokens = dropped = 0
    for batch in loader:
        assert batch["hidden_states"].shape == (1, total, 3 * hidden)
        assert batch["hidden_states"].dtype == torch.bfloat16
        assert bool(torch.isfinite(batch["hidden_states"].float()).all())
        tokens += int((batch["document_ids"] >= 0).sum())
        dropped += batch["error_records"]
    written = [open_format("speculators", out.path).read_sample(r).input_ids.shape[0] for r in out.written_rows]
    assert tokens == sum(n - 1 for n in written)  # shift_batch drops one position per sample
    assert dropped == unavailable  # the bad row, counted by the collator as unavailable


def row_of(ref: Any) -> int:
    match = re.search(r"data_(\d+)\.ckpt$", ref.feature_store_uri)
    assert match, ref.feature_store_uri
    return int(match.group(1))


def load_all(out: Output, max_len: int, batch_size: int = 1) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
    """Every batch SpecForge's offline loader yields, with the rows it holds."""
    refs = build_offline_reader(str(out.path), run_id="test", ttt_length=7, max_len=max_len).read()
    loader = FeatureDataLoader(
        LocalFeatureStore("test"),
        refs=refs,
        batch_size=batch_size,
        collate_fn=build_offline_collator(),
        per_sample_transform=build_offline_normalizer(max_len),
        drop_last=False,
        strategy="eagle3",
    )
    row = {ref.sample_id: row_of(ref) for ref in refs}
    return [([row[i] for i in batch.sample_ids], batch.tensors) for batch in loader]
