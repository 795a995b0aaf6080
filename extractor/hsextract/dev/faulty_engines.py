"""Deliberately broken dump paths: the embedded engine with one fault at a time, for proving the spot check.

:class:`FaultyEngine` is the real :class:`~hsextract.capture.embedded.Engine` with one step of its *dump*
path changed, chosen by its ``fault`` attribute (settable between runs, so one loaded model serves every
fault); the spot check's path (one unbatched forward of the row, ``_forward_alone``) is left as it is, so
the engine's second opinion stays right and the dump goes wrong, as a broken hook would. The faults:

* ``aux_one_layer_late``: every aux state taken one decoder layer later than it says;
* ``final_before_norm``: the final layer's output before the final norm stored as the post-norm state;
* ``states_one_token_late``: every state stored one token late (position ``t`` holds ``t - 1``'s);
* ``another_rows_states``: the states of another row of the same length, under this row's token ids;
* ``fp8_scale_doubled``: FP8 dumps whose per-token scales are twice what the values were quantized with.

Used by the tests (``tests/test_spot_check.py``, through :data:`FAULTS`) and the GPU benchmark
(``bench/bench_gpu_spot_check.py``); never by ``hsextract serve``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from hsextract.capture.dump_sink import Fp8Rows
from hsextract.capture.embedded import Engine

FAULT_NAMES = (
    "aux_one_layer_late",
    "final_before_norm",
    "states_one_token_late",
    "another_rows_states",
    "fp8_scale_doubled",
)


def _one_token_late(states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[batch, L, H]`` states moved one position later (position 0 keeps its own)."""
    return [torch.cat([s[:, :1], s[:, :-1]], dim=1) for s in states]


class _OtherTokens(torch.nn.Module):
    """The decoder stack run on another row's tokens: each id mapped to another of the vocabulary."""

    def __init__(self, base: torch.nn.Module, vocab_size: int) -> None:
        super().__init__()
        self.inner = base
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.inner(input_ids=(input_ids * 7919 + 13) % self.vocab_size, **kwargs)


class FaultyEngine(Engine):
    """The engine with the dump-path fault named by ``fault`` ("" or None: none)."""

    fault: str | None = None

    def _gather(self, rows, states, prenorm, with_prenorm):  # type: ignore[no-untyped-def]
        if self.fault == "states_one_token_late":
            states = _one_token_late(states)
            prenorm = None if prenorm is None else _one_token_late([prenorm])[0]
        if self.fault == "final_before_norm":
            aux, _, before = super()._gather(rows, states, prenorm, True)
            return aux, before, before if with_prenorm else None
        aux, final, before = super()._gather(rows, states, prenorm, with_prenorm)
        if self.fault == "aux_one_layer_late":
            aux = torch.stack([rows(states[c + 1]) for c in self.capture], dim=1)
        return aux, final, before

    def _gather_fp8(self, rows, input_ids, states, prenorm, prenorm_slot):  # type: ignore[no-untyped-def]
        if self.fault == "states_one_token_late":
            states = _one_token_late(states)
            prenorm = None if prenorm is None else _one_token_late([prenorm])[0]
        if self.fault == "aux_one_layer_late":
            states = [*states[1:], states[-1]]  # hidden_states[c + 1] in every aux slot; the final state kept
        if self.fault == "final_before_norm":
            prenorm_slot = [True] * len(prenorm_slot)
        good: Fp8Rows = super()._gather_fp8(rows, input_ids, states, prenorm, prenorm_slot)
        if self.fault == "fp8_scale_doubled":
            return Fp8Rows(good.input_ids, good.hidden_states, good.scales * 2, good.model_dtype)
        return good

    @contextmanager
    def _dump_path_base(self) -> Iterator[None]:
        """While a dumped forward runs: the decoder stack on other tokens, for ``another_rows_states``."""
        if self.fault != "another_rows_states":
            yield
            return
        real = self.base
        self.base = _OtherTokens(real, self.vocab_size)
        try:
            yield
        finally:
            self.base = real

    def _forward_batch(self, requests: list[Any]) -> None:
        with self._dump_path_base():
            super()._forward_batch(requests)

    def _forward_chunk(self, requests: list[Any]) -> None:
        with self._dump_path_base():
            super()._forward_chunk(requests)


def _with_fault(name: str) -> type[FaultyEngine]:
    return type(f"FaultyEngine_{name}", (FaultyEngine,), {"fault": name})


#: one engine class per fault, by name (the tests start one server per fault)
FAULTS: dict[str, type[FaultyEngine]] = {name: _with_fault(name) for name in FAULT_NAMES}
AuxOneLayerLate = FAULTS["aux_one_layer_late"]
FinalBeforeNorm = FAULTS["final_before_norm"]
