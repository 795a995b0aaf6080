"""The dump files: write, read back, states, and damaged dumps as DumpErrors (never tracebacks)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hsextract.contract.files.dumps import (
    DONE_FILE,
    HIDDEN_FILE,
    META_FILE,
    Dump,
    DumpMeta,
    DumpSource,
    dump_path,
    dump_state,
    read_dump,
    remove_dump,
    write_dump,
    write_error_marker,
    write_fp8_dump,
    write_stacked_dump,
)
from hsextract.contract.files.fp8 import FP8_DTYPE, bytes_per_token, dequantize, quantize_per_token
from hsextract.contract.rids import make_rid
from hsextract.contract.states import DumpState
from hsextract.errors import DumpError

SOURCE = DumpSource("test", "1", "/models/m", layer_ids=[1, 3, 4], capture_indices=[2, 4, 5], final_layer_id=7)


def write(root: Path, tokens: int = 5, prenorm: bool = True) -> Path:
    aux = torch.randn(tokens, 3, 8).to(torch.bfloat16)
    final = torch.randn(tokens, 8).to(torch.bfloat16)
    rid = make_rid(3, tokens)
    return write_dump(root, rid, torch.arange(tokens), aux, final, SOURCE, final.clone() if prenorm else None, extend_passes=2)


def test_round_trip_with_typed_meta(tmp_path: Path) -> None:
    directory = write(tmp_path)
    dump = read_dump(directory)
    assert dump.input_ids.tolist() == [0, 1, 2, 3, 4] and dump.input_ids.dtype == torch.int64
    assert dump.meta.source == SOURCE
    assert (dump.meta.num_tokens, dump.meta.num_aux_layers, dump.meta.hidden_size, dump.meta.dtype) == (5, 3, 8, "bfloat16")
    assert dump.meta.has_final_prenorm and dump.meta.extend_passes == 2
    assert dump.final_prenorm_hidden_state is not None
    on_disk = json.loads((directory / META_FILE).read_text())
    assert on_disk["layer_ids"] == [1, 3, 4] and on_disk["rid"] == directory.name  # one flat object
    assert DumpMeta.from_json(on_disk, directory) == dump.meta
    # the model-dtype layout is exactly as before: no FP8 keys in meta.json, none on the Dump
    assert "storage_dtype" not in on_disk and "final_slot" not in on_disk
    assert not dump.is_fp8 and dump.hidden_states is None and dump.hidden_states_scales is None
    assert dump.model_dtype == "bfloat16"


def test_fp8_round_trip(tmp_path: Path) -> None:
    states = torch.randn(6, 4, 8).to(torch.bfloat16)
    q, scales = quantize_per_token(states)
    rid = make_rid(4, 6)
    directory = write_fp8_dump(
        tmp_path, rid, torch.arange(6), q, scales, SOURCE, model_dtype="bfloat16", final_slot="prenorm", extend_passes=3
    )
    dump = read_dump(directory)
    assert dump.is_fp8 and dump.storage_dtype == "float8_e4m3fn" and dump.meta.storage_dtype == "float8_e4m3fn"
    assert dump.meta.final_slot == "prenorm" and dump.meta.has_final_prenorm and dump.meta.extend_passes == 3
    assert (dump.meta.num_tokens, dump.meta.num_aux_layers, dump.meta.hidden_size, dump.meta.dtype) == (6, 3, 8, "bfloat16")
    assert dump.model_dtype == "bfloat16"
    assert dump.hidden_states is not None and dump.hidden_states_scales is not None
    assert dump.hidden_states.dtype == FP8_DTYPE and torch.equal(dump.hidden_states.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(dump.hidden_states_scales, scales)
    assert dump.aux_hidden_states is None and dump.final_hidden_state is None and dump.final_prenorm_hidden_state is None
    assert torch.equal(dequantize(dump.hidden_states, dump.hidden_states_scales), dequantize(q, scales))
    with pytest.raises(DumpError, match=r"float8_e4m3fn.*the specforge writer does not read") as caught:
        dump.plain_states("the specforge writer")
    assert caught.value.reason == "dtype_mismatch"
    # the payload: ids, then one FP8 byte per state and a float32 scale per token
    assert payload_bytes(directory / HIDDEN_FILE) == 6 * 8 + 6 * bytes_per_token(4, 8)
    plain = write_dump(tmp_path, make_rid(5, 6), torch.arange(6), states[:, :3], states[:, 3], SOURCE)
    assert payload_bytes(plain / HIDDEN_FILE) == 6 * 8 + 6 * 4 * 8 * 2


@pytest.mark.parametrize(("tokens", "contiguous"), [(5, True), (1500, True), (7, False)])
def test_stacked_round_trip_without_the_state_not_asked_for(tmp_path: Path, tokens: int, contiguous: bool) -> None:
    """Stacked [aux..., pre-norm final] in the model's dtype: the file holds exactly what safetensors' save_file writes
    for the stacked tensor (1500 tokens: more buffers than one writev takes; parts not contiguous: built piece by
    piece), the post-norm state is absent, and a step that needs it is told why and what to change."""
    aux = torch.randn(tokens, 3, 8).to(torch.bfloat16)
    prenorm = torch.randn(tokens, 8).to(torch.bfloat16)
    if not contiguous:
        aux = torch.randn(3, tokens, 8).to(torch.bfloat16).transpose(0, 1)
    rid = make_rid(6, tokens)
    ids = torch.arange(tokens)
    directory = write_stacked_dump(tmp_path, rid, ids, aux, prenorm, SOURCE, final_slot="prenorm", extend_passes=2)
    dump = read_dump(directory)
    stacked = torch.cat([aux, prenorm.unsqueeze(1)], dim=1)
    assert dump.is_stacked and not dump.is_fp8 and dump.hidden_states is not None and torch.equal(dump.hidden_states, stacked)
    assert dump.meta.final_slot == "prenorm" and dump.meta.has_final_prenorm and dump.meta.storage_dtype is None
    assert (dump.meta.num_tokens, dump.meta.num_aux_layers, dump.meta.hidden_size, dump.meta.dtype) == (tokens, 3, 8, "bfloat16")
    assert dump.aux_hidden_states is not None and torch.equal(dump.aux_hidden_states, aux)
    assert dump.final_prenorm_hidden_state is not None and torch.equal(dump.final_prenorm_hidden_state, prenorm)
    assert dump.final_hidden_state is None and dump.hidden_states_scales is None and dump.model_dtype == "bfloat16"
    assert payload_bytes(directory / HIDDEN_FILE) == tokens * 8 + stacked.numel() * 2  # no post-norm state
    save_file({"input_ids": torch.arange(tokens), "hidden_states": stacked}, str(tmp_path / "library.safetensors"))
    assert (directory / HIDDEN_FILE).read_bytes()[-stacked.numel() * 2 :] == (tmp_path / "library.safetensors").read_bytes()[
        -stacked.numel() * 2 :
    ]
    with pytest.raises(DumpError, match=r"pre-norm final state alone.*the specforge writer needs the post-norm") as caught:
        dump.plain_states("the specforge writer")
    assert caught.value.reason == "missing_final_postnorm"
    with pytest.raises(ValueError, match="final_slot"):
        write_stacked_dump(tmp_path, make_rid(7, tokens), torch.arange(tokens), aux, prenorm, SOURCE, final_slot="norm")


def payload_bytes(path: Path) -> int:
    data = path.read_bytes()
    return len(data) - 8 - int.from_bytes(data[:8], "little")


def test_fp8_writer_refuses_wrong_tensors(tmp_path: Path) -> None:
    q, scales = quantize_per_token(torch.randn(2, 2, 4))
    rid = make_rid(1, 2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        write_fp8_dump(tmp_path, rid, torch.arange(2), q.float(), scales, SOURCE, model_dtype="float32", final_slot="prenorm")
    with pytest.raises(ValueError, match=r"\[T, 1, 1\]"):
        write_fp8_dump(tmp_path, rid, torch.arange(2), q, scales[:1], SOURCE, model_dtype="float32", final_slot="prenorm")
    with pytest.raises(ValueError, match="final_slot"):
        write_fp8_dump(tmp_path, rid, torch.arange(2), q, scales, SOURCE, model_dtype="float32", final_slot="norm")


def test_a_dump_holds_exactly_one_layout() -> None:
    meta = DumpMeta("r", 1, 1, 4, "float32", False, 1, 0.0, SOURCE)
    ids, state = torch.zeros(1, dtype=torch.int64), torch.zeros(1, 1, 4)
    q, scales = quantize_per_token(torch.zeros(1, 2, 4))
    with pytest.raises(DumpError, match="mixes or lacks layouts"):
        Dump(
            "r", ids, meta, aux_hidden_states=state, final_hidden_state=state[:, 0], hidden_states=q, hidden_states_scales=scales
        )
    with pytest.raises(DumpError, match="mixes or lacks layouts"):
        Dump("r", ids, meta, hidden_states=q, hidden_states_scales=scales, storage_dtype="float8_e5m2")
    with pytest.raises(DumpError, match="mixes or lacks layouts"):
        Dump("r", ids, meta)
    stacked_meta = DumpMeta("r", 1, 1, 4, "float32", True, 1, 0.0, SOURCE, final_slot="prenorm")
    both = torch.zeros(1, 2, 4)
    with pytest.raises(DumpError, match="mixes or lacks layouts"):  # stacked, yet claiming both final states
        Dump("r", ids, stacked_meta, aux_hidden_states=both[:, :1], final_hidden_state=both[:, 1],
             final_prenorm_hidden_state=both[:, 1], hidden_states=both)  # fmt: skip
    assert Dump.stacked("r", ids, stacked_meta, both).is_stacked


def test_states(tmp_path: Path) -> None:
    rid = make_rid(1, 5)
    assert dump_state(tmp_path / rid) is DumpState.PENDING
    write_error_marker(tmp_path, rid, "disk full")
    assert dump_state(tmp_path / rid) is DumpState.ERROR
    assert dump_state(write(tmp_path)) is DumpState.DONE


def test_write_is_idempotent(tmp_path: Path) -> None:
    first = write(tmp_path)
    before = (first / HIDDEN_FILE).read_bytes()
    second = write(tmp_path)
    assert first == second and (second / HIDDEN_FILE).read_bytes() == before


def test_bad_rid_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(DumpError) as caught:
        dump_path(tmp_path, "hsx-000000001-n5/../../etc")
    assert caught.value.reason == "bad_rid"


def test_no_done_sentinel_is_incomplete(tmp_path: Path) -> None:
    directory = write(tmp_path)
    (directory / DONE_FILE).unlink()
    with pytest.raises(DumpError) as caught:
        read_dump(directory)
    assert caught.value.reason == "dump_incomplete"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / HIDDEN_FILE).write_bytes((d / HIDDEN_FILE).read_bytes()[:50]), "dump_unreadable"),
        (lambda d: (d / META_FILE).write_text("{not json"), "dump_unreadable"),
        (lambda d: (d / META_FILE).write_text('{"rid": "x"}'), "dump_malformed"),
        (lambda d: (d / META_FILE).write_text("[1, 2]"), "dump_malformed"),
    ],
)
def test_damaged_dumps_are_dump_errors(tmp_path: Path, damage: object, reason: str) -> None:
    directory = write(tmp_path)
    damage(directory)  # type: ignore[operator]
    with pytest.raises(DumpError) as caught:
        read_dump(directory)
    assert caught.value.reason == reason


def test_read_dump_says_when_its_done_marker_was_written(tmp_path: Path) -> None:
    directory = write(tmp_path)
    os.utime(directory / DONE_FILE, (1_700_000_000.5, 1_700_000_000.5))
    assert read_dump(directory).completed_at == 1_700_000_000.5


def test_a_symlink_in_a_request_directorys_place_is_unsafe_not_pending(tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "elsewhere")
    (tmp_path / "dumps").mkdir()
    link = tmp_path / "dumps" / elsewhere.name
    link.symlink_to(elsewhere)
    with pytest.raises(DumpError) as caught:
        dump_state(link)
    assert caught.value.reason == "unsafe_dump" and "symlink" in str(caught.value)


def test_remove_dump_removes_the_dump_and_what_else_is_inside(tmp_path: Path) -> None:
    plain = write(tmp_path)
    remove_dump(plain)
    assert not plain.exists()
    with_leftover = write(tmp_path / "other")
    (with_leftover / ".hidden.safetensors.tmp-1-2").write_bytes(b"a writer's temp file")
    remove_dump(with_leftover)
    assert not with_leftover.exists()
    remove_dump(tmp_path / "never-made")  # nothing there: nothing to do


def test_remove_dump_unlinks_a_symlink_in_its_place_and_leaves_the_target(tmp_path: Path) -> None:
    target = write(tmp_path / "target")
    (tmp_path / "dumps").mkdir()
    link = tmp_path / "dumps" / target.name
    link.symlink_to(target)
    remove_dump(link)
    assert not os.path.lexists(link)
    assert sorted(p.name for p in target.iterdir()) == sorted([DONE_FILE, HIDDEN_FILE, META_FILE])
