"""Compare a dump with the engine's own states of the same row (:class:`SpotCheckAnswer`).

The engine returned the last ``answer.rows`` positions of a prompt of ``prompt_tokens`` tokens (the
row, or its first ``spot_check_max_tokens``), which are dump positions ``prompt_tokens - rows ..
prompt_tokens - 1``. Each tensor the answer holds is compared there, position by position:

    excess = |dump - engine| - rounding(|engine|)      (the stored dtype's rounding of that value)
    error  = max(excess over the position's values) / max |engine| at that position

and the position mismatches when ``error > tolerance``. ``rounding`` is the storage's: 0 in float32,
``2^-8·|x|`` in bfloat16, ``2^-11·|x|`` in float16, ``2^-4·|x| + 2^-10·scale`` in FP8 e4m3 (its 3
mantissa bits, and half its smallest subnormal step). ``tolerance`` covers the engine computing the
same row in another batch and other chunks (batched matmuls round differently): by default
:data:`COMPUTE_NOISE` of the model's dtype, relative to the position's largest value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hsextract.contract.dumps import Dump
from hsextract.contract.spot_check import SpotCheckAnswer

#: the model dtype's batch-to-batch noise allowed, relative to a position's largest value
COMPUTE_NOISE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}
#: relative rounding of a value stored in the dump's dtype
UNIT_ROUNDOFF = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float8_e4m3fn": 2.0**-4}
#: FP8 e4m3's smallest subnormal step, in units of the token's scale: 2^-9
FP8_SUBNORMAL_STEP = 2.0**-9


@dataclass(frozen=True)
class TensorCheck:
    """One tensor compared at the returned positions."""

    tensor: str  # "aux layer 3", "final"
    positions: int
    worst_error: float
    worst_position: int
    tolerance: float
    mismatched: tuple[int, ...]  # dump positions over the tolerance

    @property
    def ok(self) -> bool:
        return not self.mismatched

    def describe(self) -> str:
        if self.ok:
            return f"{self.tensor}: {self.positions} positions within {self.tolerance:.1e} (worst {self.worst_error:.1e})"
        shown = ", ".join(str(p) for p in self.mismatched[:8]) + (", ..." if len(self.mismatched) > 8 else "")
        return (
            f"{self.tensor}: {len(self.mismatched)} of {self.positions} positions differ beyond {self.tolerance:.1e} "
            f"(positions {shown}; worst {self.worst_error:.3g} at position {self.worst_position}, relative to its largest value)"
        )


@dataclass(frozen=True)
class Comparison:
    """Every tensor compared for one row, and what could not be."""

    checks: tuple[TensorCheck, ...]
    first_position: int  # dump positions first_position .. first_position + rows - 1
    rows: int
    unchecked: tuple[str, ...]  # what the answer could not check, said in words

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def describe(self) -> str:
        where = f"positions {self.first_position}..{self.first_position + self.rows - 1}"
        bad = [c.describe() for c in self.checks if not c.ok] or [c.describe() for c in self.checks]
        return f"{where}: " + "; ".join(bad)


def dump_states(dump: Dump) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """``(aux [T, K, H], final post-norm [T, H] or None, storage dtype)`` in float32, FP8 dequantized."""
    if dump.is_fp8:
        assert dump.hidden_states is not None and dump.hidden_states_scales is not None
        states = dump.hidden_states.float() * dump.hidden_states_scales.float()
        final = states[:, -1] if dump.meta.final_slot == "postnorm" else None
        return states[:, :-1], final, "float8_e4m3fn"
    aux, final = dump.plain_states("the spot check")
    return aux.float(), final.float(), str(aux.dtype).removeprefix("torch.")


def _rounding(engine: torch.Tensor, storage: str, scales: torch.Tensor | None) -> torch.Tensor:
    rounding = engine.abs() * UNIT_ROUNDOFF.get(storage, 0.0)
    if scales is not None:  # FP8: half the smallest subnormal step of the token's scale
        rounding = rounding + scales.reshape(-1, *([1] * (engine.dim() - 1))) * FP8_SUBNORMAL_STEP / 2
    return rounding


def _check(name: str, dumped: torch.Tensor, engine: torch.Tensor, first: int, storage: str, scales: torch.Tensor | None,
           tolerance: float) -> TensorCheck:  # fmt: skip
    """``dumped`` and ``engine`` ``[rows, H]``: one error per position."""
    excess = ((dumped - engine).abs() - _rounding(engine, storage, scales)).clamp(min=0)
    largest = engine.abs().amax(dim=-1).clamp(min=1e-30)
    errors = excess.amax(dim=-1) / largest
    worst = int(errors.argmax())
    bad = (errors > tolerance).nonzero().flatten().tolist()
    return TensorCheck(name, int(errors.numel()), float(errors[worst]), first + worst, tolerance,
                       tuple(first + int(i) for i in bad))  # fmt: skip


def compare(
    dump: Dump, answer: SpotCheckAnswer, prompt_tokens: int, layer_ids: list[int], tolerance: float | None = None
) -> Comparison:
    """The dump against the engine's answer for a prompt of the dump's first ``prompt_tokens`` tokens."""
    aux, final, storage = dump_states(dump)
    num_aux, hidden = int(aux.shape[1]), int(aux.shape[2])
    rows = answer.rows
    first = prompt_tokens - rows
    if rows > prompt_tokens or first < 0:
        raise ValueError(f"the engine returned {rows} rows for a prompt of {prompt_tokens} tokens")
    noise = tolerance if tolerance is not None else COMPUTE_NOISE.get(dump.model_dtype, COMPUTE_NOISE["bfloat16"])
    scales = None
    if dump.is_fp8:
        assert dump.hidden_states_scales is not None
        scales = dump.hidden_states_scales.float().reshape(-1)[first:prompt_tokens]
    checks: list[TensorCheck] = []
    unchecked: list[str] = []
    width = int(answer.hidden.shape[1])
    if width == num_aux * hidden:
        engine_aux = answer.hidden.reshape(rows, num_aux, hidden)
        for k, layer in enumerate(layer_ids):
            checks.append(_check(f"aux layer {layer}", aux[first:prompt_tokens, k], engine_aux[:, k], first, storage,
                                 scales, noise))  # fmt: skip
    elif width == hidden and final is not None:  # a server without aux capture returns the final state
        checks.append(_check("final", final[first:prompt_tokens], answer.hidden, first, storage, scales, noise))
        unchecked.append("aux layers (the engine returned the final state only)")
    else:
        raise ValueError(
            f"the engine returned states {width} wide; the dump holds {num_aux} aux layers of {hidden} "
            f"(expected {num_aux * hidden}, or {hidden} for the final state)"
        )
    if answer.final is not None and final is not None and width != hidden:
        checks.append(_check("final", final[first:prompt_tokens], answer.final[-rows:], first, storage, scales, noise))
    elif width != hidden:
        why = "an FP8 dump whose final slot is pre-norm" if final is None else "the engine does not return it"
        unchecked.append(f"final state ({why})")
    if first > 0:
        unchecked.append(f"positions 0..{first - 1} (the engine returned only its last extend pass)")
    if prompt_tokens < int(aux.shape[0]):
        unchecked.append(f"positions {prompt_tokens}..{int(aux.shape[0]) - 1} (past spot_check_max_tokens)")
    return Comparison(tuple(checks), first, rows, tuple(unchecked))
