"""FP8 hidden states in speculators' own format (``hs-connectors`` 0.9.0, ``fp8_utils.py``).

One float32 scale per token over all its slots and the hidden dimension::

    fp32 = x.float(); amax = |fp32|.amax over every dimension but the first
    scale = clamp(amax / 448, min=1e-12);   q = (fp32 / scale).to(float8_e4m3fn)
    restored = q.to(dtype) * scale.to(dtype)

:func:`quantize_per_token` and :func:`dequantize` are that arithmetic, operation for operation, so a
tensor quantized here is bit for bit what ``quantize_tensor_to_fp8`` gives (a trainers test checks
it against the released package). The capture side quantizes on the device, before the copy to the
host: the dump, the pinned buffers and the device-to-host copy all hold half the bytes of bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# re-exported: most code asks this module for the storage names
from hsextract.contract.files.storages import FP8_STORAGE as FP8_STORAGE
from hsextract.contract.files.storages import STORAGES as STORAGES

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
#: the smallest scale (a token whose states are all zero)
MIN_SCALE = 1e-12


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, S, H]`` (any float dtype, any device) to ``(fp8 [T, S, H], float32 scales [T, 1, 1])``
    on the same device: hs-connectors' ``quantize_tensor_to_fp8`` exactly."""
    if x.dim() != 3:
        raise ValueError(f"quantize_per_token takes [T, slots, H]; got shape {tuple(x.shape)}")
    fp32 = x.float()
    amax = fp32.abs().amax(dim=(1, 2), keepdim=True)
    scales = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return (fp32 / scales).to(FP8_DTYPE), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """hs-connectors' ``dequantize_fp8_tensor``: ``q.to(dtype) * scales.to(dtype)``."""
    return q.to(dtype) * scales.to(dtype)


def bytes_per_token(slots: int, hidden: int) -> int:
    """Bytes of one token in an FP8 dump or speculators file: ``slots * hidden`` FP8 values and a float32 scale."""
    return slots * hidden + 4


@dataclass(frozen=True)
class TokenErrors:
    """Max and mean over tokens of one per-token error."""

    max: float
    mean: float


def _per_token(values: torch.Tensor) -> TokenErrors:
    if values.numel() == 0:
        return TokenErrors(0.0, 0.0)
    return TokenErrors(float(values.max()), float(values.mean()))


def relative_frobenius_error(restored: torch.Tensor, reference: torch.Tensor) -> TokenErrors:
    """Per token ``||restored - reference|| / ||reference||`` over all its slots (a zero token counts 0
    when restored is zero too); max and mean over tokens. Both ``[T, ...]``, compared in float32."""
    diff = (restored.float() - reference.float()).reshape(reference.shape[0], -1)
    ref = reference.float().reshape(reference.shape[0], -1)
    num, den = diff.norm(dim=1), ref.norm(dim=1)
    return _per_token(torch.where(den > 0, num / den.clamp(min=1e-30), num))


def max_error_over_amax(restored: torch.Tensor, reference: torch.Tensor) -> TokenErrors:
    """Per token the largest element error divided by the token's ``amax`` (the scale's reference:
    FP8 e4m3 rounding keeps it under 2**-4); max and mean over tokens."""
    diff = (restored.float() - reference.float()).abs().reshape(reference.shape[0], -1)
    amax = reference.float().abs().reshape(reference.shape[0], -1).amax(dim=1)
    worst = diff.amax(dim=1) if diff.shape[1] else torch.zeros_like(amax)
    return _per_token(torch.where(amax > 0, worst / amax.clamp(min=1e-30), worst))
