"""Deliberately broken dump paths: the embedded engine with one fault each, for proving the spot check.

Each class is the real :class:`~hsextract.capture.embedded.Engine` with one step of its *dump* path
changed; the spot check's path (one unbatched forward of the row, ``_forward_alone``) is left as it is,
so the engine's second opinion stays right and the dump goes wrong, as a broken hook would. Used by the
tests (``tests/test_spot_check.py``) and the GPU benchmark (``bench/bench_gpu_spot_check.py``); never by
``hsextract serve``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hsextract.capture.dump_sink import Fp8Rows
from hsextract.capture.embedded import Engine


class AuxOneLayerLate(Engine):
    """Every aux state taken one decoder layer later than it says (``hidden_states[c + 1]``)."""

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        _, final, before = super()._gather(rows, states, prenorm, with_prenorm)
        return torch.stack([rows(states[c + 1]) for c in self.capture], dim=1), final, before

    def _gather_fp8(self, rows, input_ids, states, prenorm, prenorm_slot):  # type: ignore[no-untyped-def]
        return super()._gather_fp8(rows, input_ids, [*states[1:], states[-1]], prenorm, prenorm_slot)


class FinalBeforeNorm(Engine):
    """The final layer's output before the final norm stored as the post-norm final state."""

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        aux, _, before = super()._gather(rows, states, prenorm, True)
        return aux, before, before if with_prenorm else None

    def _gather_fp8(self, rows, input_ids, states, prenorm, prenorm_slot):  # type: ignore[no-untyped-def]
        return super()._gather_fp8(rows, input_ids, states, prenorm, [True] * len(prenorm_slot))


def _one_token_late(states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[batch, L, H]`` states moved one position later (position 0 keeps its own)."""
    return [torch.cat([s[:, :1], s[:, :-1]], dim=1) for s in states]


class StatesOneTokenLate(Engine):
    """Every state stored one token late: position ``t`` holds what position ``t - 1`` computed."""

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        late = _one_token_late(states)
        before = None if prenorm is None else _one_token_late([prenorm])[0]
        return super()._gather(rows, late, before, with_prenorm)

    def _gather_fp8(self, rows, input_ids, states, prenorm, prenorm_slot):  # type: ignore[no-untyped-def]
        before = None if prenorm is None else _one_token_late([prenorm])[0]
        return super()._gather_fp8(rows, input_ids, _one_token_late(states), before, prenorm_slot)


class _OtherTokens(torch.nn.Module):
    """The decoder stack run on another row's tokens: each id mapped to another of the vocabulary."""

    def __init__(self, base: torch.nn.Module, vocab_size: int) -> None:
        super().__init__()
        self.inner = base
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.inner(input_ids=(input_ids * 7919 + 13) % self.vocab_size, **kwargs)

    def __getattr__(self, name: str) -> Any:  # norm, config, forward's signature: the real stack's
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


class AnotherRowsStates(Engine):
    """The dump holds the states of another row of the same length, under this row's token ids."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._true_base = self.base
        self.base = _OtherTokens(self.base, self.vocab_size)

    def _forward_alone(self, requests: list[Any]) -> None:
        wrong, self.base = self.base, self._true_base
        try:
            super()._forward_alone(requests)
        finally:
            self.base = wrong


class Fp8ScaleDoubled(Engine):
    """FP8 dumps whose per-token scales are twice what the values were quantized with."""

    def _gather_fp8(self, rows, input_ids, states, prenorm, prenorm_slot):  # type: ignore[no-untyped-def]
        good: Fp8Rows = super()._gather_fp8(rows, input_ids, states, prenorm, prenorm_slot)
        return Fp8Rows(good.input_ids, good.hidden_states, good.scales * 2, good.model_dtype)


#: by the name the benchmark and the tests use
FAULTS: dict[str, type[Engine]] = {
    "aux_one_layer_late": AuxOneLayerLate,
    "final_before_norm": FinalBeforeNorm,
    "states_one_token_late": StatesOneTokenLate,
    "another_rows_states": AnotherRowsStates,
    "fp8_scale_doubled": Fp8ScaleDoubled,
}
