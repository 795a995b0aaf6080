"""Our FP8 speculators outputs (``--storage float8_e4m3fn``) through speculators 0.9.0's own ``fp8``
hidden-states backend: the backend the flag in data_config.json names (hs-connectors' ``FP8Transfer``),
``ArrowDataset`` and the multipack loader with its collator, as ``speculators`` training wires them. What the
trainer sees is ``hs_connectors.fp8_utils.dequantize_fp8_tensor`` of the tensors we stored, bit for bit,
and our own reader's dequantized values are the same."""

from __future__ import annotations

import argparse

import pytest
import torch
from hs_connectors.fp8_utils import dequantize_fp8_tensor
from hs_connectors.transfer import FP8Transfer, HiddenStatesBackend
from safetensors.torch import load_file
from speculators.train.data import ArrowDataset
from speculators.train.recovery import SampleUnavailable

from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.output.formats import open_format

from .helpers import BAD_ROW, ROWS, Output, arrow_dataset, assert_multipack_collates_every_written_token

ARCHS = ["deepseek_v3", "llama"]


def transfer_from_flags(out: Output) -> FP8Transfer:
    """The transfer speculators' training builds from the recorded flags (cli.py: backend registry, from_train_args)."""
    flags = out.config["trainer"]["flags"]
    backend = HiddenStatesBackend.registry[flags["--hidden-states-backend"]]
    args = argparse.Namespace(hidden_states_path=str(out.path / flags["--hidden-states-path"]))
    transfer = backend.from_train_args(args, str(out.path / flags["--data-path"]))
    assert isinstance(transfer, FP8Transfer)
    return transfer


def dataset_from_flags(out: Output, total_seq_len: int) -> ArrowDataset:
    return arrow_dataset(out, total_seq_len, transfer_from_flags(out))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fp8_backend_reads_our_values_bit_for_bit(output, arch: str) -> None:
    out = output(arch, "speculators", storage=FP8_STORAGE)
    config = out.config
    assert config["dtype"] == FP8_STORAGE and config["trainer"]["flags"]["--hidden-states-backend"] == "fp8"
    dataset = dataset_from_flags(out, config["trainer"]["flags"]["--total-seq-len"])
    assert len(dataset) == len(ROWS)
    fmt, hidden = open_format("speculators", out.path), config["hidden_size"]
    for row in range(len(ROWS)):
        item = dataset[row]
        if row not in out.written_rows:
            assert row == BAD_ROW and isinstance(item, SampleUnavailable)
            continue
        raw = load_file(str(fmt.sample_path(row)))
        assert raw["hidden_states"].dtype == torch.float8_e4m3fn
        theirs = dequantize_fp8_tensor(raw["hidden_states"], raw["hidden_states_scales"], dtype=torch.bfloat16)
        tokens = theirs.shape[0]
        assert item["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(item["hidden_states"], theirs[:, :-1].reshape(tokens, 3 * hidden))
        assert torch.equal(item["verifier_last_hidden_states"], theirs[:, -1])  # the pre-norm slot
        aux, final = fmt.read_sample(row).dequantized(torch.bfloat16)
        assert torch.equal(aux, theirs[:, :-1]) and torch.equal(final, theirs[:, -1])


def test_the_multipack_loader_collates_every_written_token_of_an_fp8_output(output) -> None:
    out = output("llama", "speculators", storage=FP8_STORAGE)
    assert_multipack_collates_every_written_token(out, dataset_from_flags(out, out.config["trainer"]["flags"]["--total-seq-len"]))
