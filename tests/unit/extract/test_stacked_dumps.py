"""Dumps stacked in the model's dtype (issue 37): the embedded server writes a request that asks for the pre-norm final
state as ``hidden_states [T, K+1, H]``, speculators' own sample layout, without the post-norm state. The sink writes it
from the batch's rows; the checks hold it to the output's shape, dtype and final state; the speculators writer stores
it as it is (the library's bytes); the spot check compares its pre-norm state with the engine's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hsextract.capture.dump_sink import DumpSink, ExtendBatch, Segment
from hsextract.capture.pinned import HostCopier
from hsextract.contract.files.dumps import DumpSource, read_dump, write_stacked_dump
from hsextract.contract.files.tensor_file import tiled
from hsextract.contract.rids import make_rid
from hsextract.contract.spot_check import SpotCheckAnswer
from hsextract.errors import DumpError
from hsextract.extract.checks.dump_checks import DumpExpectation, check_dump
from hsextract.extract.checks.spot_compare import compare
from hsextract.output.formats import open_format
from hsextract.output.sample import Sample

AUX, HIDDEN, TOKENS = [1, 3, 4], 16, 6
SOURCE = DumpSource("test", "1", "/models/m", AUX, [a + 1 for a in AUX], final_layer_id=7, provides_final_prenorm=True)


def _expect(need_prenorm: bool = True, dtype: str = "bfloat16") -> DumpExpectation:
    return DumpExpectation(AUX, [a + 1 for a in AUX], HIDDEN, dtype, need_prenorm, model_path="/models/m")


def _stacked(root: Path, row: int = 1, final_slot: str = "prenorm") -> Path:
    torch.manual_seed(row)
    aux, last = torch.randn(TOKENS, len(AUX), HIDDEN).bfloat16(), torch.randn(TOKENS, HIDDEN).bfloat16()
    return write_stacked_dump(root, make_rid(row, TOKENS), torch.arange(TOKENS), aux, last, SOURCE, final_slot=final_slot)


def test_the_sink_stacks_only_segments_that_ask_and_leaves_out_the_post_norm_state(tmp_path: Path) -> None:
    sink = DumpSink(tmp_path / "dumps", SOURCE)
    ids, aux = torch.arange(3 * TOKENS), torch.randn(3 * TOKENS, len(AUX), HIDDEN)
    final, prenorm = torch.randn(3 * TOKENS, HIDDEN), torch.randn(3 * TOKENS, HIDDEN)
    stacked, apart, plain = (make_rid(row, TOKENS) for row in (1, 2, 3))
    segments = [
        Segment(stacked, 0, 0, TOKENS, final_prenorm=True, stacked=True),
        Segment(apart, 0, TOKENS, TOKENS, final_prenorm=True),  # the SGLang hook's: both final states, apart
        Segment(plain, 0, 2 * TOKENS, TOKENS, final_prenorm=False, stacked=True),  # nothing to stack with
    ]
    sink.submit(ExtendBatch(segments, ids, aux, final, final_prenorm=prenorm))
    sink.flush()
    sink.close()
    got = read_dump(tmp_path / "dumps" / stacked)
    assert got.is_stacked and got.final_hidden_state is None and got.hidden_states is not None
    assert torch.equal(got.hidden_states, torch.cat([aux[:TOKENS], prenorm[:TOKENS].unsqueeze(1)], dim=1))
    both = read_dump(tmp_path / "dumps" / apart)
    assert not both.is_stacked and both.final_prenorm_hidden_state is not None and both.final_hidden_state is not None
    assert not read_dump(tmp_path / "dumps" / plain).is_stacked


def test_the_checks_hold_a_stacked_dump_to_the_outputs_shape_dtype_and_final_state(tmp_path: Path) -> None:
    dump = read_dump(_stacked(tmp_path))
    check_dump(dump, list(range(TOKENS)), _expect())
    with pytest.raises(DumpError) as shape:
        check_dump(dump, list(range(TOKENS)), DumpExpectation(AUX, [a + 1 for a in AUX], 2 * HIDDEN, "bfloat16", True))
    assert shape.value.reason == "shape_mismatch"
    with pytest.raises(DumpError) as dtype:
        check_dump(dump, list(range(TOKENS)), _expect(dtype="float32"))
    assert dtype.value.reason == "dtype_mismatch"
    with pytest.raises(DumpError) as specforge:
        check_dump(dump, list(range(TOKENS)), _expect(need_prenorm=False))
    assert specforge.value.reason == "missing_final_postnorm"
    post = read_dump(_stacked(tmp_path, 2, final_slot="postnorm"))
    check_dump(post, list(range(TOKENS)), _expect(need_prenorm=False))
    with pytest.raises(DumpError) as speculators:
        check_dump(post, list(range(TOKENS)), _expect())
    assert speculators.value.reason == "missing_final_prenorm"
    assert dump.hidden_states is not None
    dump.hidden_states[2, 3, 5] = float("nan")
    with pytest.raises(DumpError) as nan:
        check_dump(dump, list(range(TOKENS)), _expect())
    assert nan.value.reason == "non_finite"
    check_dump(dump, list(range(TOKENS)), _expect(), values=False)  # left to the writer


def test_the_speculators_writer_stores_a_stacked_dump_as_the_library_would(tmp_path: Path) -> None:
    dump = read_dump(_stacked(tmp_path / "dumps"))
    assert dump.hidden_states is not None
    fmt = open_format("speculators", tmp_path / "out")
    written = fmt.write_sample(Sample(4, list(range(TOKENS)), [1] * TOKENS, TOKENS), dump)
    save_file({"token_ids": dump.input_ids, "hidden_states": dump.hidden_states.clone()}, str(tmp_path / "library.safetensors"))
    assert fmt.sample_path(4).read_bytes() == (tmp_path / "library.safetensors").read_bytes()
    assert written.bytes == fmt.sample_path(4).stat().st_size
    stored = fmt.read_sample(4)
    assert torch.equal(stored.final_hidden_state, dump.final_prenorm_hidden_state)  # type: ignore[arg-type]
    with pytest.raises(DumpError) as specforge:
        open_format("specforge", tmp_path / "sf").write_sample(Sample(4, list(range(TOKENS)), [1] * TOKENS, TOKENS), dump)
    assert specforge.value.reason == "missing_final_postnorm"


def test_the_spot_check_compares_the_stacked_pre_norm_state_with_the_engines(tmp_path: Path) -> None:
    dump = read_dump(_stacked(tmp_path))
    assert dump.aux_hidden_states is not None and dump.final_prenorm_hidden_state is not None
    engine_aux = dump.aux_hidden_states.float().reshape(TOKENS, -1)
    prenorm = dump.final_prenorm_hidden_state.float()
    normed = prenorm / prenorm.pow(2).mean(-1, keepdim=True).sqrt()
    good = compare(dump, SpotCheckAnswer("x", engine_aux, normed, prenorm), TOKENS, AUX)
    assert good.ok and "final before the norm" in [c.tensor for c in good.checks]
    assert not any(text.startswith("final state") for text in good.unchecked)
    swapped = compare(dump, SpotCheckAnswer("x", engine_aux, prenorm, normed), TOKENS, AUX)  # the post-norm state dumped
    assert not swapped.ok
    without = compare(dump, SpotCheckAnswer("x", engine_aux), TOKENS, AUX)  # SGLang's answer: aux states alone
    assert without.ok and "final state (a dump stacked with the pre-norm final state)" in without.unchecked


def test_tiled_finds_the_one_tensor_behind_its_slot_ranges_and_nothing_else() -> None:
    base = torch.randn(TOKENS, len(AUX) + 1, HIDDEN)
    whole = tiled((base[:, :-1], base[:, -1].unsqueeze(1)))
    assert whole is not None and whole.data_ptr() == base.data_ptr() and torch.equal(whole, base)
    assert tiled((base[:1, :-1], base[:1, -1:])) is not None  # one token: its stride says nothing
    apart = (torch.randn(TOKENS, len(AUX), HIDDEN), torch.randn(TOKENS, 1, HIDDEN))
    assert tiled(apart) is None
    assert tiled((base[:, -1:], base[:, :-1])) is None  # out of order
    assert tiled((base[:, :2], base[:, -1:])) is None  # a slot left out
    assert tiled((base[::2, :-1], base[::2, -1:])) is None  # every other token
    assert tiled((base[:, :-1], base[:, -1:].to(torch.bfloat16))) is None


def test_the_copier_brings_aux_and_the_pre_norm_state_to_the_host_as_one_tensor() -> None:
    """The engine stacks [aux..., pre-norm] on the device; the host rows are views of one tensor the same way, which the
    sink writes as it is (a stacked dump without a copy to stack it)."""
    base = torch.randn(TOKENS, len(AUX) + 1, HIDDEN)
    ids, final = torch.arange(TOKENS), torch.randn(TOKENS, HIDDEN)
    segments = [Segment(make_rid(1, TOKENS), 0, 0, TOKENS, stacked=True)]
    batch = HostCopier(slots=1, pin=False).copy(segments, ids, final, base[:, :-1], base[:, -1])
    assert batch.final_prenorm is not None
    host = tiled((batch.aux, batch.final_prenorm.unsqueeze(1)))
    assert host is not None and torch.equal(host, base) and host.data_ptr() != base.data_ptr()
    assert torch.equal(batch.final, final)
    apart = HostCopier(slots=1, pin=False).copy(segments, ids, final, base[:, :-1].contiguous(), base[:, -1].clone())
    assert apart.final_prenorm is not None and tiled((apart.aux, apart.final_prenorm.unsqueeze(1))) is None
    assert torch.equal(apart.aux, base[:, :-1]) and torch.equal(apart.final_prenorm, base[:, -1])
