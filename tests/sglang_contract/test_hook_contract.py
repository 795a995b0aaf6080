"""The dump hook against SGLang's own hook registration, LogitsProcessor and ForwardBatch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.runtime_context import get_parallel

from hsextract.capture.sglang import hook as sglang_hook
from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import hook_specs
from hsextract.contract.files.dumps import dump_state, read_dump, read_error
from hsextract.contract.files.fp8 import dequantize, quantize_per_token, relative_frobenius_error
from hsextract.contract.hook_config import HookConfig
from hsextract.contract.rids import make_rid
from hsextract.errors import ConfigError

from .helpers import H, decode_batch, extend_batch

K = 3
LAYERS = [2, 4, 5]


def specs(dump_dir: Path, **extra: Any) -> list[dict[str, Any]]:
    config = SGLangLaunchConfig(model_path="/m", dump_dir=str(dump_dir), num_hidden_layers=8, **extra)
    return hook_specs(config, LAYERS)


def states(n: int, padding: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.randn(n + padding, H)
    aux = torch.randn(n + padding, K * H)
    return hidden, aux


def test_several_requests_padding_and_foreign_rids_packed_aux(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    a, b = make_rid(10, 5), make_rid(11, 3)
    rids = ["HEALTH_CHECK_123", a, "warmup_req", b]
    batch = extend_batch(rids, [0, 0, 0, 0], [1, 5, 2, 3], padding=4)
    hidden, aux = states(11, padding=4)
    out = run.forward(batch, hidden, aux)
    assert out.next_token_logits is not None  # the forward itself is unchanged
    run.flush()
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == sorted([a, b])
    for rid, start, n in ((a, 1, 5), (b, 8, 3)):
        dump = read_dump(tmp_path / "dumps" / rid)
        assert torch.equal(dump.input_ids, batch.input_ids[start : start + n])
        got_aux, got_final = dump.plain_states("this test")
        assert torch.equal(got_final, hidden[start : start + n])
        assert torch.equal(got_aux, aux[start : start + n].view(n, K, H))
        assert dump.meta.source.layer_ids == LAYERS and dump.meta.source.capture_indices == [3, 5, 6]
        assert dump.meta.source.engine == "sglang" and dump.meta.source.engine_version == "0.5.23"


def test_prompt_split_over_two_chunks_in_different_batches_list_aux(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rid = make_rid(7, 9)
    first = extend_batch([rid], [0], [6])
    hidden1, aux1 = torch.randn(6, H), [torch.randn(6, H) for _ in range(K)]
    run.forward(first, hidden1, aux1)
    run.flush()
    assert dump_state(tmp_path / "dumps" / rid) == "pending"
    other = make_rid(8, 2)
    second = extend_batch([other, rid], [0, 6], [2, 3], padding=3)
    hidden2, aux2 = torch.randn(8, H), [torch.randn(8, H) for _ in range(K)]
    run.forward(second, hidden2, aux2)
    run.flush()
    dump = read_dump(tmp_path / "dumps" / rid)
    assert torch.equal(dump.input_ids, torch.cat([first.input_ids[:6], second.input_ids[2:5]]))
    got_aux, got_final = dump.plain_states("this test")
    assert torch.equal(got_final, torch.cat([hidden1, hidden2[2:5]]))
    for k in range(K):
        assert torch.equal(got_aux[:, k], torch.cat([aux1[k], aux2[k][2:5]]))
    assert dump.meta.extend_passes == 2
    assert read_dump(tmp_path / "dumps" / other).input_ids.shape == (2,)


def test_retracted_request_prefilled_again_writes_the_same_dump(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rid = make_rid(3, 4)
    batch = extend_batch([rid], [0], [4])
    hidden, aux = states(4)
    run.forward(batch, hidden, aux)
    run.flush()
    before = (tmp_path / "dumps" / rid / "hidden.safetensors").read_bytes()
    run.forward(batch, hidden, aux)
    run.flush()
    assert (tmp_path / "dumps" / rid / "hidden.safetensors").read_bytes() == before


def test_decode_batches_dump_nothing(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rid = make_rid(1, 3)
    run.forward(decode_batch([rid, make_rid(2, 5)], [4, 6]), torch.randn(2, H), torch.randn(2, K * H))
    run.flush()
    assert not any((tmp_path / "dumps").iterdir())


def test_hostile_rids_never_become_paths(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rids = ["hsx-../../x-n3", "hsx-000000001-n3/../../y", "../hsx-000000001-n3"]
    batch = extend_batch(rids, [0, 0, 0], [3, 3, 3])
    run.forward(batch, *states(9))
    run.flush()
    assert not any((tmp_path / "dumps").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps"]


def test_missing_aux_leaves_an_error_marker_and_never_raises(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rid = make_rid(5, 2)
    out = run.forward(extend_batch([rid], [0], [2]), torch.randn(2, H), None)
    assert out.next_token_logits.shape[0] == 1
    assert dump_state(tmp_path / "dumps" / rid) == "error"
    assert "--enable-return-aux-hidden-states" in read_error(tmp_path / "dumps" / rid)


def test_wrong_number_of_aux_layers_is_an_error_marker(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps"))
    rid = make_rid(6, 2)
    run.forward(extend_batch([rid], [0], [2]), torch.randn(2, H), [torch.randn(2, H)] * 2)
    assert "captures 2 aux layers" in read_error(tmp_path / "dumps" / rid)


def test_prenorm_hook_on_model_norm(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps", final_prenorm=True))
    rid = make_rid(9, 4)
    hidden, aux = states(4)
    residual = torch.randn(4, H)
    run.forward(extend_batch([rid], [0], [4]), hidden, aux, residual=residual)
    run.flush()
    dump = read_dump(tmp_path / "dumps" / rid)
    assert dump.final_prenorm_hidden_state is not None
    assert torch.allclose(dump.final_prenorm_hidden_state, hidden + residual)
    total = hidden + residual
    assert torch.allclose(dump.plain_states("this test")[1], total / total.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())


def test_only_the_writer_rank_registers_a_hook(published_server_args, tmp_path: Path) -> None:
    config = specs(tmp_path / "dumps")[0]["config"]
    single = dict(tp_size=1, attn_tp_size=1, attn_dp_size=1, attn_cp_size=1, attn_cp_rank=0, moe_ep_size=1, moe_dp_size=1)
    with get_parallel().override(
        **{**single, "tp_size": 4, "attn_tp_size": 4, "moe_ep_size": 4, "tp_rank": 3, "attn_tp_rank": 3}
    ):
        assert sglang_hook.make_hook(config) is None
    # attention DP, 2 groups of 2: TP rank 2 is attention-TP rank 0 of group 1, so it writes
    dp = {**single, "tp_size": 4, "attn_tp_size": 2, "attn_dp_size": 2, "moe_ep_size": 4}
    with get_parallel().override(**dp, tp_rank=2, attn_dp_rank=1, attn_tp_rank=0):
        assert sglang_hook.make_hook(config) is not None
    with get_parallel().override(**dp, tp_rank=3, attn_dp_rank=1, attn_tp_rank=1):
        assert sglang_hook.make_hook(config) is None
    sglang_hook._DUMPERS.pop(Path(config["dump_dir"])).sink.close()


def test_fp8_storage_quantizes_prenorm_rows_and_assembles_chunks(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps", final_prenorm=True, storage="float8_e4m3fn"))
    rid, other = make_rid(20, 7), make_rid(21, 2)
    hidden1, aux1 = states(4)
    residual1 = torch.randn(4, H)
    run.forward(extend_batch([rid], [0], [4]), hidden1, aux1, residual=residual1)
    hidden2, aux2 = states(5, padding=2)
    residual2 = torch.randn(7, H)
    run.forward(extend_batch(["warmup_req", other, rid], [0, 0, 4], [0, 2, 3], padding=2), hidden2, aux2, residual=residual2)
    run.flush()
    dump = read_dump(tmp_path / "dumps" / rid)
    assert dump.is_fp8 and dump.meta.final_slot == "prenorm" and dump.meta.extend_passes == 2
    assert dump.meta.dtype == "float32" and dump.aux_hidden_states is None and dump.final_hidden_state is None
    prenorm = torch.cat([(hidden1 + residual1), (hidden2 + residual2)[2:5]])
    aux = torch.cat([aux1, aux2[2:5]]).view(7, K, H)
    want, want_scales = quantize_per_token(torch.cat([aux, prenorm.unsqueeze(1)], dim=1))
    assert dump.hidden_states is not None and dump.hidden_states_scales is not None
    assert torch.equal(dump.hidden_states.view(torch.uint8), want.view(torch.uint8))  # the same arithmetic, per token
    assert torch.equal(dump.hidden_states_scales, want_scales)
    assert read_dump(tmp_path / "dumps" / other).hidden_states is not None


def test_fp8_storage_with_list_aux_holds_the_post_norm_final(served, tmp_path: Path) -> None:
    run = served(specs(tmp_path / "dumps", storage="float8_e4m3fn"))
    rid = make_rid(30, 3)
    hidden, aux = torch.randn(3, H), [torch.randn(3, H) for _ in range(K)]
    run.forward(extend_batch([rid], [0], [3]), hidden, aux)
    run.flush()
    dump = read_dump(tmp_path / "dumps" / rid)
    assert dump.meta.final_slot == "postnorm" and not dump.meta.has_final_prenorm
    assert dump.hidden_states is not None and dump.hidden_states_scales is not None
    restored = dequantize(dump.hidden_states, dump.hidden_states_scales, torch.float32)
    assert relative_frobenius_error(restored, torch.stack([*aux, hidden], dim=1)).max < 0.07


def test_unknown_storage_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="float8_e4m3fn"):
        HookConfig.parse({"dump_dir": "/dev/shm/x", "storage": "int8"})
    spec = specs(Path("/dev/shm/x"), storage="float8_e4m3fn")[0]
    assert spec["config"]["storage"] == "float8_e4m3fn"
    assert "storage" not in specs(Path("/dev/shm/x"))[0]["config"]
