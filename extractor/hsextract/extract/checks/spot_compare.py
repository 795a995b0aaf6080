"""Compare a dump with the engine's own states of the same row (:class:`SpotCheckAnswer`): is the dump
the engine's tensor computed in another batch, or another tensor?

The engine returned the last ``answer.rows`` positions of a prompt of ``prompt_tokens`` tokens (the
row, or its first ``spot_check_max_tokens``): dump positions ``prompt_tokens - rows .. prompt_tokens - 1``.
For each tensor the answer holds (every aux layer; the final state where the engine returns it), with
``D_t`` the dump's and ``E_t`` the engine's vector at position ``t``, all distances norm-wise and relative
to ``|E_t|``, each the **median over the checked positions**:

    error       = median_t |D_t - E_t| / |E_t|          how far the dump is from the engine's state
    separation  = min_A median_t |A_t - E_t| / |E_t|    how far the nearest *other* tensor is

where the alternatives ``A`` are what a wrong dump would most likely hold and the answer itself has:
every other tensor of the answer (the other captured layers, the final state, and from the embedded
server the final state before the norm and, for the first aux layer, the layers either side of it) at
the same positions, and the same tensor one position earlier and one later (states shifted by a token). The dump matches
when ``error <= separation / margin`` (:data:`DEFAULT_MARGIN`, 2): it is at least twice as close to
the engine's state as that state is to anything else the engine computed. A dump that holds an
alternative sits at ``error == separation`` (twice the bound); the engine's own batch-to-batch noise
measured on the H200 sits well below half of it (bench/results-gpu-spot-check.json). No threshold is
tuned to a model: the yardstick is the model's own geometry at that row.

Why these choices, from what the H200 and the CPU showed (issue 34): the worst *element* of a position
against a fixed bound flagged correct rows on every model of real depth (bf16 batch noise reaches 5-7 %
of a position's largest value there) and passed a neighbouring layer on the tiny ones (about 1 %).
Norm-wise errors average the noise out; the median over positions lets a mixture of experts route a
few tokens to another expert (a rounding difference can flip a near-tie, and such a position
legitimately moves by as much as a layer does) while a wrong tensor, which moves every position, is
still caught.

A tensor whose nearest alternative is within twice the ``margin`` times the storage's own rounding of
the engine's state (FP8 stores to about 3 %) cannot be told from noise on this model at this row: it is
not judged (``separable`` False) and the run's ``not_checked`` says so, rather than passing or failing
silently. So is a tensor with no alternative at all (one aux layer, one position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hsextract.contract import defaults
from hsextract.contract.files.dumps import Dump
from hsextract.contract.files.fp8 import FP8_DTYPE
from hsextract.contract.spot_check import SpotCheckAnswer

#: a match is at least this many times closer to the engine's state than that state is to its nearest alternative
DEFAULT_MARGIN = defaults.SPOT_CHECK_MARGIN
#: the engine's state stored in the dump's dtype, for the rounding floor
_STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class TensorCheck:
    """One tensor compared at the returned positions (distances relative to the engine's state, medians over positions)."""

    tensor: str  # "aux layer 3", "final"
    positions: int
    error: float  # the dump's distance from the engine's state
    worst_error: float  # the largest of one position
    worst_position: int
    separation: float  # the engine's state's distance from its nearest alternative
    nearest: str  # that alternative, in words
    dump_closest: str  # the alternative the dump is closest to
    dump_to_closest: float  # ... and its distance from the dump
    rounding: float  # the storage's own rounding of the engine's state
    margin: float

    @property
    def separable(self) -> bool:
        """Whether noise and another tensor can be told apart here at all."""
        return self.separation > 2 * self.margin * self.rounding and self.nearest != ""

    @property
    def bound(self) -> float:
        return self.separation / self.margin

    @property
    def ok(self) -> bool:
        return not self.separable or self.error <= self.bound

    @property
    def sureness(self) -> float:
        """How many times farther the nearest alternative is than the dump's error (inf: an exact match)."""
        return self.separation / self.error if self.error > 0 else float("inf")

    def describe(self) -> str:
        where = f"{self.tensor}: {self.positions} positions"
        if not self.separable:
            return (
                f"{where}: cannot be told from another tensor here (its nearest alternative, {self.nearest or 'none'}, is "
                f"{self.separation:.3g} away, against the storage's rounding {self.rounding:.2g}); not judged"
            )
        verdict = "matches" if self.ok else "DIFFERS"
        return (
            f"{where}: {verdict}: the dump is {self.error:.3g} from the engine's state (median; worst {self.worst_error:.3g} "
            f"at position {self.worst_position}) and {self.dump_to_closest:.3g} from {self.dump_closest}; the nearest "
            f"alternative, {self.nearest}, is {self.separation:.3g} from the engine's state, and a match is within "
            f"{self.bound:.3g} (1/{self.margin:g} of that)"
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


def dump_states(dump: Dump) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, str]:
    """``(aux [T, K, H], final post-norm [T, H] or None, final pre-norm [T, H] or None, storage dtype)`` in float32, FP8
    dequantized: a stacked dump (FP8, or the model's dtype) holds the one final state its last slot names."""
    if dump.is_fp8:
        assert dump.hidden_states is not None and dump.hidden_states_scales is not None
        states = dump.hidden_states.float() * dump.hidden_states_scales.float()
        prenorm = dump.meta.final_slot == "prenorm"
        return states[:, :-1], None if prenorm else states[:, -1], states[:, -1] if prenorm else None, "float8_e4m3fn"
    aux, final, before = dump.aux_hidden_states, dump.final_hidden_state, dump.final_prenorm_hidden_state
    assert aux is not None  # a model-dtype dump, plain or stacked

    def as_float(state: torch.Tensor | None) -> torch.Tensor | None:
        return None if state is None else state.float()

    return aux.float(), as_float(final), as_float(before), str(aux.dtype).removeprefix("torch.")


def _relative(a: torch.Tensor, b: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """``|a_t - b_t| / norms_t`` per position."""
    distances: torch.Tensor = torch.linalg.vector_norm(a - b, dim=-1) / norms
    return distances


def _median(values: torch.Tensor) -> float:
    return float(values.median()) if values.numel() else float("inf")


def stored_rounding(engine: torch.Tensor, storage: str, scales: torch.Tensor | None = None) -> torch.Tensor:
    """Per position, the relative error of storing the engine's ``[n, H]`` states in ``storage`` (FP8:
    with the dump's per-token ``scales [n]``, shared by every slot of a token)."""
    norms = torch.linalg.vector_norm(engine, dim=-1).clamp(min=1e-30)
    if scales is not None:
        scale = scales.reshape(-1, 1)
        stored = (engine / scale).to(FP8_DTYPE).float() * scale
    else:
        stored = engine.to(_STORAGE_DTYPES.get(storage, torch.float32)).float()
    return _relative(stored, engine, norms)


def check_tensor(
    name: str, dumped: torch.Tensor, engine: torch.Tensor, others: dict[str, torch.Tensor], first: int, storage: str,
    scales: torch.Tensor | None = None, margin: float = DEFAULT_MARGIN,
) -> TensorCheck:  # fmt: skip
    """``dumped``, ``engine`` and each of ``others`` ``[n, H]`` at dump positions ``first ..``: one verdict."""
    norms = torch.linalg.vector_norm(engine, dim=-1).clamp(min=1e-30)
    errors = _relative(dumped, engine, norms)
    worst = int(errors.argmax())
    alternatives = dict(others)
    if engine.shape[0] > 1:  # the same tensor a token off: [t] against [t - 1] and [t + 1]
        alternatives[f"{name} one position earlier"] = torch.cat([engine[:1] * float("nan"), engine[:-1]])
        alternatives[f"{name} one position later"] = torch.cat([engine[1:], engine[:1] * float("nan")])
    nearest, separation, closest, to_closest = "", float("inf"), "", float("inf")
    for label, alternative in alternatives.items():
        distance = _relative(alternative, engine, norms)
        keep = ~distance.isnan()
        value = _median(distance[keep])
        if value < separation:
            nearest, separation = label, value
        from_dump = _median(_relative(dumped, alternative, norms)[keep])
        if from_dump < to_closest:
            closest, to_closest = label, from_dump
    rounding = _median(stored_rounding(engine, storage, scales))
    return TensorCheck(
        name, int(errors.numel()), _median(errors), float(errors[worst]), first + worst, separation, nearest, closest,
        to_closest, rounding, margin,
    )  # fmt: skip


def compare(
    dump: Dump, answer: SpotCheckAnswer, prompt_tokens: int, layer_ids: list[int], margin: float = DEFAULT_MARGIN
) -> Comparison:
    """The dump against the engine's answer for a prompt of the dump's first ``prompt_tokens`` tokens."""
    aux, final, prenorm, storage = dump_states(dump)
    num_aux, hidden = int(aux.shape[1]), int(aux.shape[2])
    rows = answer.rows
    first = prompt_tokens - rows
    if rows > prompt_tokens or first < 0:
        raise ValueError(f"the engine returned {rows} rows for a prompt of {prompt_tokens} tokens")
    width = int(answer.hidden.shape[1])
    engine: dict[str, torch.Tensor] = {}
    dumped: dict[str, torch.Tensor] = {}
    unchecked: list[str] = []
    if width == num_aux * hidden:
        engine_aux = answer.hidden.reshape(rows, num_aux, hidden)
        for k, layer in enumerate(layer_ids):
            engine[f"aux layer {layer}"] = engine_aux[:, k]
            dumped[f"aux layer {layer}"] = aux[first:prompt_tokens, k]
        engine_final = answer.final[-rows:] if answer.final is not None else None
    elif width == hidden and final is not None:  # a server without aux capture returns the final state
        engine_final = answer.hidden
        unchecked.append("aux layers (the engine returned the final state only)")
    else:
        raise ValueError(
            f"the engine returned states {width} wide; the dump holds {num_aux} aux layers of {hidden} "
            f"(expected {num_aux * hidden}, or {hidden} for the final state)"
        )
    if engine_final is not None:
        engine["final"] = engine_final
    if engine_final is not None and final is not None:
        dumped["final"] = final[first:prompt_tokens]
    elif final is not None or prenorm is None or answer.prenorm is None:  # else the pre-norm state is checked below
        why = "a dump stacked with the pre-norm final state" if final is None else "the engine does not return it"
        unchecked.append(f"final state ({why})")
    scales = None
    if dump.hidden_states_scales is not None:  # FP8: one scale per token
        scales = dump.hidden_states_scales.float().reshape(-1)[first:prompt_tokens]
    if answer.prenorm is not None and ("final" in engine or prenorm is not None):  # the embedded server's answer
        engine["final before the norm"] = answer.prenorm[-rows:]
        if prenorm is not None and final is None:  # the dump's own final state: checked (else an alternative only)
            dumped["final before the norm"] = prenorm[first:prompt_tokens]
    neighbours: dict[str, torch.Tensor] = {}  # the embedded server's: the layers either side of the first aux layer
    if answer.neighbours is not None and width == num_aux * hidden and answer.neighbours.shape[1] == 2 * hidden:
        first_layer = layer_ids[0]
        neighbours[f"layer {first_layer - 1} (one layer early)"] = answer.neighbours[-rows:, :hidden]
        neighbours[f"layer {first_layer + 1} (one layer late)"] = answer.neighbours[-rows:, hidden:]
    checks = []
    for name, state in engine.items():
        if name not in dumped:  # an alternative only
            continue
        others = {other: value for other, value in engine.items() if other != name}
        if name == f"aux layer {layer_ids[0]}":
            others.update(neighbours)
        checks.append(check_tensor(name, dumped[name], state, others, first, storage, scales, margin))
    unchecked.extend(f"{c.tensor} (cannot be told from another tensor on this model)" for c in checks if not c.separable)
    if first > 0:
        unchecked.append(f"positions 0..{first - 1} (the engine returned only its last extend pass)")
    if prompt_tokens < int(aux.shape[0]):
        unchecked.append(f"positions {prompt_tokens}..{int(aux.shape[0]) - 1} (past spot_check_max_tokens)")
    return Comparison(tuple(checks), first, rows, tuple(unchecked))
