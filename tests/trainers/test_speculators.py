"""Our speculators-format outputs through speculators 0.9.0's own released offline data path.

What ``speculators`` training builds from ``--data-path``, ``--hidden-states-path`` and
``--on-missing``: hs-connectors' ``FileTransfer``, ``ArrowDataset`` (which runs
``check_hidden_states``'s layout), the multipack batch sampler and ``CollateFn`` with the EAGLE-3
``shift_batch`` preprocessing, as ``_setup_dataloader`` wires them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from datasets import load_from_disk
from hs_connectors import FileTransfer
from speculators.data_generation.offline import check_hidden_states
from speculators.models.utils import resolve_target_layer_ids
from speculators.train.config.schema import DataArgs, GenerationArgs
from speculators.train.dataloader import _setup_dataloader
from speculators.train.recovery import SampleUnavailable

from hsextract.contract.layers import capture_indices, default_aux_layer_ids
from hsextract.output.formats import open_format
from hsextract.output.formats.speculators import SPECULATORS_DEFAULT_TOTAL_SEQ_LEN

from .helpers import BAD_ROW, ROWS, assert_multipack_collates_every_written_token, dataset_from_flags

ARCHS = ["deepseek_v3", "llama", "qwen2"]


@pytest.mark.parametrize("arch", ARCHS)
def test_arrow_dataset_reads_every_row_and_skips_the_bad_one(output, arch: str) -> None:
    out = output(arch, "speculators")
    flags = out.config["trainer"]["flags"]
    assert flags["--total-seq-len"] == SPECULATORS_DEFAULT_TOTAL_SEQ_LEN == DataArgs.model_fields["total_seq_len"].default
    assert GenerationArgs.model_fields["on_missing"].default == "generate"  # why we record --on-missing skip
    dataset = dataset_from_flags(out, flags["--total-seq-len"])
    assert len(dataset) == len(ROWS)  # index i is dataset row i
    fmt = open_format("speculators", out.path)
    hidden = out.config["hidden_size"]
    for row in range(len(ROWS)):
        item = dataset[row]
        if row not in out.written_rows:
            assert row == BAD_ROW and isinstance(item, SampleUnavailable)
            continue
        assert not isinstance(item, SampleUnavailable)
        stored = fmt.read_sample(row)
        tokens = stored.input_ids.shape[0]
        assert torch.equal(item["input_ids"], stored.input_ids)
        assert item["hidden_states"].shape == (tokens, 3 * hidden)
        assert torch.equal(item["hidden_states"].view(tokens, 3, hidden), stored.aux_hidden_states)
        assert torch.equal(item["verifier_last_hidden_states"], stored.final_hidden_state)  # the pre-norm slot
        assert item["loss_mask"].shape == (tokens,) and int(item["lengths"][0]) == tokens
        file = out.path / flags["--hidden-states-path"] / f"hs_{row}.safetensors"
        check_hidden_states(FileTransfer(file.parent).get_cached(row), stored.input_ids.tolist())


@pytest.mark.parametrize("arch", ARCHS)
def test_multipack_loader_collates_every_written_token(output, arch: str) -> None:
    out = output(arch, "speculators")
    assert_multipack_collates_every_written_token(out, dataset_from_flags(out, out.config["trainer"]["flags"]["--total-seq-len"]))


def test_a_short_total_seq_len_cuts_samples_the_plan_would_warn_about(output) -> None:
    out = output("llama", "speculators")
    dataset = dataset_from_flags(out, 1024)
    loader = _setup_dataloader(dataset, 1024, out.config["hidden_size"], num_workers=0, num_target_layers=3, prefetch_factor=None)
    tokens = sum(int((batch["document_ids"] >= 0).sum()) for batch in loader)
    written = [open_format("speculators", out.path).read_sample(r).input_ids.shape[0] for r in out.written_rows]
    assert tokens < sum(written)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_target_layer_ids_name_the_states_we_extract_by_default(output, arch: str) -> None:
    out = output(arch, "speculators")
    defaults = resolve_target_layer_ids(None, str(out.model))
    assert defaults == capture_indices(default_aux_layer_ids(8)) == out.config["trainer"]["flags"]["--target-layer-ids"]
    assert defaults == out.config["hf_hidden_states_indices"][:3]


def test_prenorm_slot_through_the_verifiers_norm_and_head_gives_the_models_argmax(output) -> None:
    out = output("deepseek_v3", "speculators")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out.model)).eval()
    data = load_from_disk(str(Path(out.path) / "data"))
    row = out.written_rows[0]
    stored = open_format("speculators", out.path).read_sample(row)
    assert torch.equal(data[row]["input_ids"], stored.input_ids)
    with torch.no_grad():
        logits = model.lm_head(model.model.norm(stored.final_hidden_state.unsqueeze(0)))[0]
        own = model(stored.input_ids.unsqueeze(0)).logits[0]
    assert (logits.argmax(-1) == own.argmax(-1)).float().mean().item() >= 0.99
