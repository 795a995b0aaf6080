"""Our specforge-format outputs through SpecForge 0.2.0's own released offline data path.

The path ``specforge train`` takes with ``data.hidden_states_path``: ``OfflineManifestReader`` lists
the feature files, ``LocalFeatureStore`` loads them, the EAGLE-3 offline normalizer cuts them to
``data.max_length`` and ``DataCollatorWithPadding`` batches them in ``FeatureDataLoader``; the
frozen ``TargetHead`` turns the stored final state into the target logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from specforge.algorithms.model_providers import resolve_eagle_capture_layers
from specforge.config.schema import Config, DataConfig
from specforge.modeling.target.target_head import TargetHead

from hsextract.contract.layers import default_aux_layer_ids
from hsextract.output.formats import open_format
from hsextract.output.formats.specforge import SPECFORGE_DEFAULT_MAX_LENGTH, SPECFORGE_DTYPE

from .helpers import BAD_ROW, MAX_SEQ_LEN, load_all

ARCHS = ["deepseek_v3", "llama", "qwen2"]


@pytest.mark.parametrize("arch", ARCHS)
def test_offline_loader_yields_every_stored_sample_with_the_recorded_max_length(output, arch: str) -> None:
    out = output(arch, "specforge")
    config = out.config
    max_length = config["trainer"]["config"]["data"]["max_length"]
    assert max_length == MAX_SEQ_LEN  # the longest stored sample, above SpecForge's default 2048
    fmt = open_format("specforge", out.path)
    batches = load_all(out, max_length)
    seen = [rows[0] for rows, _ in batches]
    assert sorted(seen) == sorted(out.written_rows) and BAD_ROW not in seen  # the bad row has no file
    hidden = config["hidden_size"]
    for rows, batch in batches:
        stored = fmt.read_sample(rows[0])
        tokens = stored.input_ids.shape[0]
        assert batch["hidden_state"].shape == (1, tokens, 3 * hidden)  # the three aux layers, concatenated
        assert batch["target"].shape == (1, tokens, hidden)
        assert batch["hidden_state"].dtype == batch["target"].dtype == torch.bfloat16
        assert torch.equal(batch["input_ids"][0], stored.input_ids)
        assert torch.equal(batch["hidden_state"][0].view(tokens, 3, hidden), stored.aux_hidden_states)
        assert torch.equal(batch["target"][0], stored.final_hidden_state)
        assert stored.loss_mask is not None
        mask = stored.loss_mask.clone()
        mask[-1] = 0  # SpecForge's normalizer drops the last position's loss
        assert torch.equal(batch["loss_mask"][0], mask)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_max_length_cuts_what_the_plan_counted(output, arch: str) -> None:
    out = output(arch, "specforge")
    assert DataConfig.model_fields["max_length"].default == SPECFORGE_DEFAULT_MAX_LENGTH
    lengths = {rows[0]: batch["input_ids"].shape[1] for rows, batch in load_all(out, SPECFORGE_DEFAULT_MAX_LENGTH)}
    samples = {r: open_format("specforge", out.path).read_sample(r).input_ids.shape[0] for r in out.written_rows}
    cut = [r for r in samples if lengths[r] < samples[r]]
    assert cut == [r for r in samples if samples[r] > SPECFORGE_DEFAULT_MAX_LENGTH] and len(cut) == 2


def test_padding_collator_batches_samples_of_different_lengths(output) -> None:
    out = output("llama", "specforge")
    batches = load_all(out, MAX_SEQ_LEN, batch_size=2)
    assert sum(len(rows) for rows, _ in batches) == len(out.written_rows)
    rows, batch = next((rows, b) for rows, b in batches if len(rows) == 2)
    lengths = [open_format("specforge", out.path).read_sample(r).input_ids.shape[0] for r in rows]
    assert batch["hidden_state"].shape[:2] == (2, max(lengths)) and batch["attention_mask"].sum().item() == sum(lengths)


@pytest.mark.parametrize("arch", ARCHS)
def test_specforge_default_capture_layers_are_the_layers_we_extract_by_default(output, arch: str) -> None:
    out = output(arch, "specforge")
    target = transformers.AutoConfig.from_pretrained(str(out.model))
    plain = Config.model_validate({"model": {"target_model_path": str(out.model)}, "data": {"hidden_states_path": str(out.path)}})
    assert resolve_eagle_capture_layers(plain, {}, target) == default_aux_layer_ids(8) == out.config["aux_layer_ids"]
    # the settings data_config.json records resolve to the SGLang value that serves these states
    recorded = out.config["trainer"]["config"]
    ours = Config.model_validate(
        {
            "model": {"target_model_path": str(out.model), **recorded["model"]},
            "data": {**recorded["data"], "hidden_states_path": str(out.path)},
        }
    )
    assert resolve_eagle_capture_layers(ours, {}, target) == out.config["serving"]["eagle_aux_hidden_state_layer_ids"]
    assert ours.data.max_length == MAX_SEQ_LEN


def test_explicit_deepseek_layers_resolve_to_the_recorded_value_not_the_default(output) -> None:
    out = output("deepseek_v3", "specforge", "2,4,5")
    target = transformers.AutoConfig.from_pretrained(str(out.model))
    recorded = out.config["trainer"]
    draft_config = recorded["draft_config"]  # the eagle_config to put in the drafter's config
    plain = Config.model_validate({"model": {"target_model_path": str(out.model)}, "data": {"hidden_states_path": "x"}})
    assert resolve_eagle_capture_layers(plain, draft_config, target) == [3, 5, 6]
    assert resolve_eagle_capture_layers(plain, {}, target) == [1, 3, 4]  # its default would be served one layer early


def test_what_the_guards_refuse_fails_in_specforge() -> None:
    # four aux layers: SpecForge's EAGLE-3 refuses them (our --format specforge refuses them before any work)
    plain = Config.model_validate({"model": {"target_model_path": "m"}, "data": {"hidden_states_path": "x"}})
    draft = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}
    with pytest.raises(ValueError, match="exactly three"):
        resolve_eagle_capture_layers(plain, draft, None)


@pytest.mark.parametrize("arch", ARCHS)
def test_target_head_on_the_stored_final_state_gives_the_models_own_argmax(output, arch: str) -> None:
    out = output(arch, "specforge")
    head = TargetHead.from_pretrained(str(out.model))
    assert head.fc.weight.dtype == getattr(torch, SPECFORGE_DTYPE)  # why we store bfloat16
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out.model)).eval()
    fmt = open_format("specforge", out.path)
    checked = 0
    for row in out.written_rows:
        stored = fmt.read_sample(row)
        with torch.no_grad():
            logits = head(stored.final_hidden_state.unsqueeze(0))[0].float()
            own = model(stored.input_ids.unsqueeze(0)).logits[0].float()
        agree = logits.argmax(-1) == own.argmax(-1)
        top2 = own.topk(2, dim=-1).values
        near_tie = (top2[:, 0] - top2[:, 1]) <= 2 * 2.0**-7 * own.abs().amax(dim=-1)  # within bf16 rounding
        assert bool((agree | near_tie).all()), f"row {row}: argmax differs at {(~agree).nonzero().flatten().tolist()}"
        assert agree.float().mean().item() >= 0.99
        # the control: the last aux state through the same head is far from the model's own prediction
        with torch.no_grad():
            control = head(stored.aux_hidden_states[:, -1].unsqueeze(0))[0].argmax(-1)
        assert (control == own.argmax(-1)).float().mean().item() < 0.5
        checked += 1
        # a float32 state would fail here at the first step: the head runs in bfloat16
        with pytest.raises(RuntimeError):
            head(stored.final_hidden_state.float().unsqueeze(0))
    assert checked == len(out.written_rows) == 4
