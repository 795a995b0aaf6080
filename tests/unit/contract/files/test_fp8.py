"""contract.fp8: speculators' per-token FP8 arithmetic, its inverse, sizes and error measures."""

from __future__ import annotations

import pytest
import torch

from hsextract.contract.files.fp8 import (
    FP8_DTYPE,
    FP8_STORAGE,
    bytes_per_token,
    dequantize,
    max_error_over_amax,
    quantize_per_token,
    relative_frobenius_error,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 8), (5, 4, 64), (17, 2, 3)])
def test_round_trip_shapes_and_error(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 7).to(dtype)
    q, scales = quantize_per_token(x)
    assert q.dtype == FP8_DTYPE and q.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == (shape[0], 1, 1)
    restored = dequantize(q, scales, dtype)
    assert restored.dtype == dtype and restored.shape == x.shape
    # e4m3 keeps 3 mantissa bits: each element within 2**-4 of its token's largest magnitude
    assert max_error_over_amax(restored, x).max <= 2**-4 + 1e-3
    assert relative_frobenius_error(restored, x).max < 0.07
    # the token's largest element lands on 448 exactly
    assert torch.allclose(q.float().abs().amax(dim=(1, 2)), torch.full((shape[0],), 448.0))


def test_zero_token_gets_the_smallest_scale_and_restores_to_zero() -> None:
    x = torch.randn(3, 2, 16)
    x[1] = 0
    q, scales = quantize_per_token(x)
    assert float(scales[1]) == pytest.approx(1e-12)
    assert torch.count_nonzero(dequantize(q, scales, torch.float32)[1]) == 0
    errors = relative_frobenius_error(dequantize(q, scales, torch.float32), x)
    assert errors.max < 0.07 and errors.mean <= errors.max


def test_quantize_keeps_the_device_and_refuses_other_ranks() -> None:
    q, scales = quantize_per_token(torch.randn(2, 3, 4, device="cpu"))
    assert q.device == scales.device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"\[T, slots, H\]"):
        quantize_per_token(torch.randn(2, 12))


def test_bytes_per_token_is_half_of_bf16_plus_the_scale() -> None:
    assert FP8_STORAGE == "float8_e4m3fn"
    assert bytes_per_token(4, 7168) == 4 * 7168 + 4
    assert bytes_per_token(4, 7168) * 2 - 8 == 4 * 7168 * 2


def test_error_helpers_report_max_and_mean_over_tokens() -> None:
    reference = torch.ones(2, 1, 4)
    restored = reference.clone()
    restored[1, 0, 0] = 1.5  # token 1: one element off by half its amax
    worst = max_error_over_amax(restored, reference)
    assert (worst.max, worst.mean) == (0.5, 0.25)
    frob = relative_frobenius_error(restored, reference)
    assert frob.max == pytest.approx(0.25) and frob.mean == pytest.approx(0.125)
