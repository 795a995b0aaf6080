"""The speculators writer checks every value it stores as it writes it (issue 37): packing then skips the dump checks'
own pass over the states. A NaN or infinity anywhere in what the sample holds fails the row with ``non_finite`` and
leaves no file; the bytes written are the library's; the file is sized before its first write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hsextract.contract.files import fp8
from hsextract.contract.files.dumps import FINAL_SLOT_PRENORM, DumpSource, read_dump, write_dump, write_fp8_dump
from hsextract.contract.files.finite import all_finite, finite_bytes
from hsextract.contract.files.tensor_file import STACKED_PIECE_BYTES, NonFinite, safetensors_size, safetensors_stream
from hsextract.errors import DumpError
from hsextract.extract.checks.dump_checks import DumpExpectation, Expectations, check_dump
from hsextract.extract.packing import pack_row
from hsextract.output.formats import open_format
from hsextract.output.sample import Sample
from hsextract.output.sample_file import SampleFile

AUX, HIDDEN = [0, 1, 2], 512
TOKENS = 700  # the aux states span several pieces of STACKED_PIECE_BYTES: a bad value in the last one is found
SOURCE = DumpSource("test", "0", "/models/m", AUX, [a + 1 for a in AUX], final_layer_id=3, provides_final_prenorm=True)


def _expect(dtype: str, storage: str | None = None) -> DumpExpectation:
    return DumpExpectation(AUX, [a + 1 for a in AUX], HIDDEN, dtype, True, model_path="/models/m", storage=storage)


def _bf16_dump(root: Path, row: int, poison: str | None = None, bad: float = float("nan")) -> Path:
    torch.manual_seed(row)
    tensors = {
        "aux": torch.randn(TOKENS, len(AUX), HIDDEN).bfloat16(),
        "final": torch.randn(TOKENS, HIDDEN).bfloat16(),
        "prenorm": torch.randn(TOKENS, HIDDEN).bfloat16(),
    }
    if poison is not None:
        tensors[poison].view(-1)[-1] = bad  # the last value of the tensor: the stream's last piece
    rid = f"hsx-{row:09d}-n{TOKENS}"
    ids = torch.arange(TOKENS)
    write_dump(root, rid, ids, tensors["aux"], tensors["final"], SOURCE, final_prenorm_hidden_state=tensors["prenorm"])
    return root / rid


def _sample(row: int) -> Sample:
    return Sample(row, list(range(TOKENS)), [1] * TOKENS, TOKENS)


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "hidden_states").iterdir()) if (out / "hidden_states").exists() else []


@pytest.mark.parametrize(("poison", "bad"), [("aux", float("nan")), ("prenorm", float("inf")), ("aux", float("-inf"))])
def test_a_bad_value_in_what_the_sample_stores_fails_the_row_and_leaves_no_file(
    tmp_path: Path, poison: str, bad: float
) -> None:
    out = tmp_path / "out"
    fmt = open_format("speculators", out)
    directory = _bf16_dump(tmp_path / "dumps", 3, poison, bad)
    with pytest.raises(DumpError) as caught:
        pack_row(fmt, out, _sample(3), directory, Expectations(_expect("bfloat16")))
    assert caught.value.reason == "non_finite" and "hidden_states" in str(caught.value)
    assert _leftovers(out) == []  # neither the sample nor its temp file


def test_packing_leaves_the_value_pass_to_the_writer_and_writes_the_librarys_bytes(tmp_path: Path) -> None:
    """The dump checks run without their pass over the states (the writer's check finds what it would), the file holds
    exactly what safetensors' save_file writes for the same tensors, and a NaN in the post-norm final state, which a
    speculators sample does not hold, is not read."""
    out = tmp_path / "out"
    fmt = open_format("speculators", out)
    assert fmt.checks_values_as_written and not open_format("specforge", tmp_path / "sf").checks_values_as_written
    directory = _bf16_dump(tmp_path / "dumps", 5, "final")
    dump = read_dump(directory)
    with pytest.raises(DumpError, match="NaN or infinite"):
        check_dump(dump, list(range(TOKENS)), _expect("bfloat16"))  # the full check still reads every state
    check_dump(dump, list(range(TOKENS)), _expect("bfloat16"), values=False)
    expected = {
        "token_ids": dump.input_ids,
        "hidden_states": torch.cat([dump.aux_hidden_states, dump.final_prenorm_hidden_state.unsqueeze(1)], dim=1),  # type: ignore[union-attr, list-item]
    }
    save_file(expected, str(tmp_path / "library.safetensors"))
    packed = pack_row(fmt, out, _sample(5), directory, Expectations(_expect("bfloat16")))
    assert fmt.sample_path(5).read_bytes() == (tmp_path / "library.safetensors").read_bytes()
    assert packed.written is not None and packed.written.bytes == fmt.sample_path(5).stat().st_size
    assert _leftovers(out) == ["hs_5.safetensors"]


def test_an_fp8_dump_with_a_nan_is_refused_by_the_writer(tmp_path: Path) -> None:
    states = torch.randn(TOKENS, len(AUX) + 1, HIDDEN).to(fp8.FP8_DTYPE)
    states.view(torch.uint8).view(-1)[-1] = 0x7F  # e4m3fn's NaN, in the last piece
    rid = f"hsx-{7:09d}-n{TOKENS}"
    write_fp8_dump(
        tmp_path / "dumps",
        rid,
        torch.arange(TOKENS),
        states,
        torch.ones(TOKENS, 1, 1),
        SOURCE,
        model_dtype="bfloat16",
        final_slot=FINAL_SLOT_PRENORM,
    )
    out = tmp_path / "out"
    expectations = Expectations(_expect("bfloat16", fp8.FP8_STORAGE))
    with pytest.raises(DumpError) as caught:
        pack_row(open_format("speculators", out), out, _sample(7), tmp_path / "dumps" / rid, expectations)
    assert caught.value.reason == "non_finite"
    assert _leftovers(out) == []


@pytest.mark.parametrize(
    ("dtype", "bits_dtype"), [(torch.bfloat16, torch.int16), (torch.float16, torch.int16), (torch.float8_e4m3fn, torch.uint8)]
)
def test_the_piece_check_agrees_with_the_tensor_check_on_every_bit_pattern(dtype: torch.dtype, bits_dtype: torch.dtype) -> None:
    width = 8 * torch.empty(0, dtype=dtype).element_size()
    patterns = torch.arange(-(1 << (width - 1)), 1 << (width - 1)) if bits_dtype.is_signed else torch.arange(1 << width)
    neighbours = torch.tensor([1.0, -2.0]).to(dtype)
    for value in patterns.to(bits_dtype).view(dtype):
        row = torch.cat([neighbours, value.reshape(1), neighbours])
        assert finite_bytes(row.view(torch.uint8).numpy().data, dtype) == all_finite(row), value


def test_the_stream_checks_plain_tensors_a_piece_at_a_time_and_names_the_bad_one() -> None:
    good = torch.randn(3 * STACKED_PIECE_BYTES // 4 + 5)  # float32: three pieces and a bit
    bad = good.clone()
    bad[-1] = float("nan")
    tensors = {"a": torch.arange(4), "b": good, "c": bad}
    pieces = []
    with pytest.raises(NonFinite) as caught:
        for piece in safetensors_stream(tensors, finite=True):
            pieces.append(piece.nbytes)
    assert caught.value.name == "c"
    assert max(pieces[2:]) <= STACKED_PIECE_BYTES and len(pieces) >= 1 + 1 + 4 + 3  # header, ids, b, c's good pieces
    assert [p.nbytes for p in safetensors_stream({"b": good})][1] == good.numel() * 4  # unchecked: one view, as before


def test_a_sized_file_is_sized_before_its_first_write_and_cut_to_what_was_written(tmp_path: Path) -> None:
    tensors = {"x": torch.randn(1000), "ids": torch.arange(7)}
    size = safetensors_size(tensors)
    path = tmp_path / "f"
    with SampleFile(path, direct=False, size=size) as out:
        assert os.fstat(out._fd).st_size == size  # what the tmpfs sees at the first write
        for piece in safetensors_stream(tensors):
            out.write(piece)
        written = out.finish()
    assert written.bytes == size == path.stat().st_size
    assert torch.equal(load_file(str(path))["x"], tensors["x"])
    with SampleFile(tmp_path / "g", direct=False, size=size + 100) as out:
        out.write(b"abc")
        written = out.finish()
    assert (tmp_path / "g").read_bytes() == b"abc" and written.bytes == 3
