"""Every dump is checked before it is packed; each mismatch has its own reason."""

from __future__ import annotations

import pytest
import torch

from hsextract.contract.files.dumps import Dump, DumpMeta, DumpSource
from hsextract.contract.files.finite import all_finite
from hsextract.errors import DumpError, LayerMismatchError
from hsextract.extract.checks.dump_checks import DumpExpectation, check_dump

T, K, H = 4, 3, 8
EXPECT = DumpExpectation([1, 3, 4], [2, 4, 5], H, "float32", need_final_prenorm=False)


def dump(layer_ids: list[int] | None = None, tensors: dict[str, torch.Tensor] | None = None) -> Dump:
    ids = layer_ids or [1, 3, 4]
    source = DumpSource("test", "1", "/m", ids, [i + 1 for i in ids])
    meta = DumpMeta("r", T, K, H, "float32", False, 1, 0.0, source)
    fields: dict[str, torch.Tensor] = {
        "input_ids": torch.arange(T),
        "aux_hidden_states": torch.zeros(T, K, H),
        "final_hidden_state": torch.zeros(T, H),
        **(tensors or {}),
    }
    return Dump("r", meta=meta, **fields)  # type: ignore[arg-type]


def test_a_good_dump_passes() -> None:
    check_dump(dump(), list(range(T)), EXPECT)


def test_other_layers_stop_the_run() -> None:
    with pytest.raises(LayerMismatchError, match=r"layer_ids \[2, 4, 5\].*expects layer_ids \[1, 3, 4\]"):
        check_dump(dump([2, 4, 5]), list(range(T)), EXPECT)


@pytest.mark.parametrize(
    ("bad", "sent", "reason"),
    [
        ({}, [0, 1, 2, 9], "token_mismatch"),
        ({}, [0, 1, 2], "token_mismatch"),
        ({"aux_hidden_states": torch.zeros(T, 2, H)}, list(range(T)), "shape_mismatch"),
        ({"final_hidden_state": torch.zeros(T, H + 1)}, list(range(T)), "shape_mismatch"),
        ({"final_hidden_state": torch.zeros(T, H, dtype=torch.bfloat16)}, list(range(T)), "dtype_mismatch"),
        ({"aux_hidden_states": torch.full((T, K, H), float("nan"))}, list(range(T)), "non_finite"),
    ],
)
def test_mismatches_name_their_reason(bad: dict[str, torch.Tensor], sent: list[int], reason: str) -> None:
    with pytest.raises(DumpError) as caught:
        check_dump(dump(tensors=bad), sent, EXPECT)
    assert caught.value.reason == reason


def test_a_format_that_needs_the_prenorm_state_refuses_a_dump_without_it() -> None:
    expect = DumpExpectation([1, 3, 4], [2, 4, 5], H, "float32", need_final_prenorm=True)
    with pytest.raises(DumpError) as caught:
        check_dump(dump(), list(range(T)), expect)
    assert caught.value.reason == "missing_final_prenorm"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_one_bad_value_anywhere(dtype: torch.dtype, bad: float) -> None:
    tensor = torch.randn(3, 5000, 7).to(dtype)
    assert all_finite(tensor)
    for index in ((0, 0, 0), (1, 2500, 3), (2, 4999, 6)):
        poisoned = tensor.clone()
        poisoned[index] = bad
        assert not all_finite(poisoned), index


@pytest.mark.parametrize(
    ("dtype", "bits_dtype"), [(torch.bfloat16, torch.int16), (torch.float16, torch.int16), (torch.float8_e4m3fn, torch.uint8)]
)
def test_all_finite_agrees_with_torch_on_every_bit_pattern(dtype: torch.dtype, bits_dtype: torch.dtype) -> None:
    """Every value of a 16- and an 8-bit float, alone and among finite values of both signs: the check reads bits."""
    width = 8 * torch.empty(0, dtype=dtype).element_size()
    patterns = torch.arange(-(1 << (width - 1)), 1 << (width - 1)) if bits_dtype.is_signed else torch.arange(1 << width)
    values = patterns.to(bits_dtype).view(dtype)
    finite = torch.isfinite(values.float())
    neighbours = torch.tensor([1.0, -2.0], dtype=torch.float32).to(dtype)
    for value, expected in zip(values, finite.tolist(), strict=True):
        assert all_finite(value.reshape(1)) == expected, value
        assert all_finite(torch.cat([neighbours, value.reshape(1), neighbours])) == expected, value


@pytest.mark.parametrize("bits", [0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF, 0xFF7FFFFF, 0xFF800000, 0xFFC00000, 0x80000000])
def test_all_finite_on_float32_at_the_edges_of_the_exponent(bits: int) -> None:
    value = torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)  # wraps to the same 32 bits
    assert all_finite(torch.cat([torch.tensor([3.0, -3.0]), value])) == bool(torch.isfinite(value).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_all_finite_accepts_the_largest_and_smallest_finite_values(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    assert all_finite(torch.tensor([info.max, -info.max, info.tiny, 0.0, -0.0], dtype=dtype))
    assert all_finite(torch.zeros(0, dtype=dtype)) and all_finite(torch.arange(4))


def test_a_bfloat16_dump_with_one_infinity_is_refused() -> None:
    aux = torch.zeros(T, K, H, dtype=torch.bfloat16)
    aux[T - 1, K - 1, H - 1] = float("inf")
    tensors = {"aux_hidden_states": aux, "final_hidden_state": torch.zeros(T, H, dtype=torch.bfloat16)}
    expect = DumpExpectation([1, 3, 4], [2, 4, 5], H, "bfloat16", need_final_prenorm=False)
    with pytest.raises(DumpError) as caught:
        check_dump(dump(tensors=tensors), list(range(T)), expect)
    assert caught.value.reason == "non_finite"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_finite_reads_views_in_place_and_only_what_they_show(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored speculators sample's aux and final states are views of one [T, K+1, H] tensor (verify reads
    them without a copy): a bad value outside a view is not the view's, one inside is found, in any chunk."""
    import hsextract.contract.files.finite as finite

    monkeypatch.setattr(finite, "_CHUNK_BYTES", 128)  # many leading-axis chunks of a small tensor
    hidden = torch.randn(50, K + 1, H).to(dtype)
    hidden[7, K, 2] = float("nan")  # in the final slot only
    aux, final = hidden[:, :-1], hidden[:, -1]
    assert not aux.is_contiguous() and not final.is_contiguous()
    assert all_finite(aux) and not all_finite(final)
    for index in ((0, 0, 0), (31, 1, 5), (49, K - 1, H - 1)):
        poisoned = hidden.clone()
        poisoned[index] = float("inf")
        assert not all_finite(poisoned[:, :-1]), index
        assert not all_finite(poisoned.transpose(0, 2)), index
    assert all_finite(torch.randn(H, 50).to(dtype).t()[:, 1:])
