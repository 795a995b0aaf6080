"""contract.fp8 against the released hs-connectors: the same FP8 bytes and scales, bit for bit."""

from __future__ import annotations

import pytest
import torch

from hsextract.contract.files.fp8 import dequantize, quantize_per_token

fp8_utils = pytest.importorskip("hs_connectors.fp8_utils")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 16), (7, 4, 64), (33, 3, 130), (5, 4, 7168)])
def test_quantize_and_dequantize_equal_hs_connectors_bit_for_bit(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    generator = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=generator) * torch.logspace(-3, 3, shape[0]).reshape(-1, 1, 1)).to(dtype)
    x[0, 0, 0] = 0  # a zero element, and a token with a huge range
    ours, our_scales = quantize_per_token(x)
    theirs, their_scales = fp8_utils.quantize_tensor_to_fp8(x)
    assert ours.dtype == theirs.dtype and our_scales.dtype == their_scales.dtype == torch.float32
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    assert torch.equal(our_scales.view(torch.int32), their_scales.view(torch.int32))
    for target in (torch.bfloat16, torch.float32):
        mine = dequantize(ours, our_scales, target)
        reference = fp8_utils.dequantize_fp8_tensor(theirs, their_scales, target)
        assert mine.dtype == reference.dtype and torch.equal(mine, reference)


def test_a_zero_token_matches_too() -> None:
    x = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    ours, our_scales = quantize_per_token(x)
    theirs, their_scales = fp8_utils.quantize_tensor_to_fp8(x)
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)) and torch.equal(our_scales, their_scales)
