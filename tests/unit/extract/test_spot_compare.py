"""The spot check's verdict on one tensor (``check_tensor``), on states whose geometry is known: a residual
stream of random updates, so the nearest alternative of each layer is known and every fault is exactly
one of the alternatives or a scaling of the state."""

from __future__ import annotations

import pytest
import torch

from hsextract.contract.files.dumps import Dump, DumpMeta, DumpSource
from hsextract.contract.files.fp8 import FP8_STORAGE, quantize_per_token
from hsextract.contract.spot_check import SpotCheckAnswer
from hsextract.extract.checks.spot_compare import check_tensor, compare, stored_rounding

POSITIONS, HIDDEN = 64, 256


def stream(layers: int = 6, seed: int = 0) -> list[torch.Tensor]:
    """``layers`` states ``[POSITIONS, HIDDEN]``: each the last plus a random update (a residual stream)."""
    generator = torch.Generator().manual_seed(seed)
    states = [torch.randn(POSITIONS, HIDDEN, generator=generator)]
    for _ in range(layers - 1):
        states.append(states[-1] + 0.6 * torch.randn(POSITIONS, HIDDEN, generator=generator))
    return states


def noisy(state: torch.Tensor, relative: float, seed: int = 1) -> torch.Tensor:
    """``state`` moved by ``relative`` of each position's norm, in a random direction."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(state.shape, generator=generator)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    moved: torch.Tensor = state + relative * state.norm(dim=-1, keepdim=True) * direction
    return moved


def judge(dumped: torch.Tensor, layer: int, states: list[torch.Tensor], storage: str = "float32"):  # type: ignore[no-untyped-def]
    others = {f"layer {i}": s for i, s in enumerate(states) if i != layer}
    return check_tensor(f"layer {layer}", dumped, states[layer], others, 0, storage)


def test_the_engines_own_noise_matches_with_room_to_spare() -> None:
    states = stream()
    check = judge(noisy(states[3], 0.03), 3, states)
    assert check.ok and check.separable
    assert check.error == pytest.approx(0.03, rel=1e-3)
    assert check.nearest in ("layer 2", "layer 4") and check.separation > 0.25
    assert check.sureness > 8
    assert "matches" in check.describe()


@pytest.mark.parametrize("other", [2, 4, 0])
def test_another_layer_differs_and_the_message_names_both_distances(other: int) -> None:
    states = stream()
    check = judge(noisy(states[other], 0.01), 3, states)
    assert not check.ok
    assert check.error >= check.separation * 0.95  # the dump sits on (or beyond) the nearest alternative
    assert check.dump_closest == f"layer {other}" and check.dump_to_closest < 0.02
    text = check.describe()
    assert "DIFFERS" in text and "from the engine's state" in text and "the nearest alternative, " in text


def test_states_one_token_late_differ() -> None:
    states = stream()
    late = torch.cat([states[3][:1], states[3][:-1]])
    check = judge(late, 3, states)
    assert not check.ok
    assert check.dump_closest == "layer 3 one position earlier" and check.dump_to_closest == 0  # it IS that alternative
    assert "0 from layer 3 one position earlier" in check.describe()


@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_a_state_scaled_by_two_differs(scale: float) -> None:
    states = stream()
    assert not judge(states[3] * scale, 3, states).ok


def test_a_minority_of_positions_routed_elsewhere_still_matches() -> None:
    """A mixture of experts: a rounding difference flips a near-tie for some tokens, which then move by as much
    as a layer does; the median over positions is the row's verdict, the worst position is reported."""
    states = stream()
    dumped = noisy(states[3], 0.02)
    flipped = torch.arange(POSITIONS) % 3 == 0  # a third of the positions
    dumped[flipped] = states[4][flipped]
    check = judge(dumped, 3, states)
    assert check.ok
    assert check.worst_error > check.separation / 2  # the flipped positions are far, and said so
    assert check.worst_position % 3 == 0


def test_a_tensor_within_the_storages_rounding_of_its_alternatives_is_not_judged() -> None:
    generator = torch.Generator().manual_seed(3)
    base = torch.randn(POSITIONS, HIDDEN, generator=generator)
    states = [base, base * 1.002 + 0.0002 * torch.randn(POSITIONS, HIDDEN, generator=generator)]
    check = judge(states[0] * 1.3, 0, states, storage="bfloat16")  # wrong, but nothing here can tell
    assert check.rounding > 0 and not check.separable
    assert check.ok  # not a verdict: the run's not_checked says so
    assert "cannot be told from another tensor" in check.describe()


def test_one_position_and_no_other_tensor_has_no_alternative() -> None:
    state = torch.randn(1, HIDDEN)
    check = check_tensor("aux layer 2", state, state, {}, 5, "float32")
    assert not check.separable and check.nearest == "" and check.worst_position == 5


def test_fp8_rounding_is_measured_with_the_dumps_scales() -> None:
    state = torch.randn(POSITIONS, HIDDEN)
    scales = state.abs().amax(dim=-1) / 448
    fp8 = float(stored_rounding(state, "float8_e4m3fn", scales).median())
    assert 0.01 < fp8 < 0.05  # e4m3: about 3 % norm-wise
    assert float(stored_rounding(state, "bfloat16").median()) < 0.005
    assert float(stored_rounding(state, "float32").max()) == 0


def _fp8_dump(states: torch.Tensor, prenorm_final: torch.Tensor, layers: list[int]) -> Dump:
    """An FP8 dump as speculators stores it: ``[T, K+1, H]`` with the pre-norm final state in the last slot."""
    source = DumpSource("test", "1", "/models/toy", layers, [i + 1 for i in layers])
    tokens = states.shape[0]
    meta = DumpMeta("r", tokens, len(layers), HIDDEN, "bfloat16", True, 1, 0.0, source,
                    storage_dtype=FP8_STORAGE, final_slot="prenorm")  # fmt: skip
    hidden, scales = quantize_per_token(torch.cat([states, prenorm_final.unsqueeze(1)], dim=1))
    return Dump("r", torch.arange(tokens), meta, hidden_states=hidden, hidden_states_scales=scales, storage_dtype=FP8_STORAGE)


def test_a_layer_set_one_late_is_caught_by_the_first_aux_layers_neighbours() -> None:
    """The Kimi-shaped model on the H200, FP8: the dump one layer late sat 0.25 from the engine's state with its
    nearest structural alternative 0.78 away: inside the bound. The embedded server's neighbours of the first aux
    layer are the alternatives that catch it; without them (SGLang returns none) it passes."""
    layers = stream(layers=20)
    captured, ids = [2, 10, 18], [1, 9, 17]  # hidden_states indexes and layer_ids
    engine = torch.stack([layers[c] for c in captured], dim=1).reshape(POSITIONS, -1)
    dump = _fp8_dump(torch.stack([layers[c + 1] for c in captured], dim=1), layers[19], ids)
    without = compare(dump, SpotCheckAnswer("x", engine), POSITIONS, ids)
    assert without.ok  # every aux layer within half its distance to the other captured layers: it passes
    neighbours = torch.cat([layers[1], layers[3]], dim=-1)
    caught = compare(dump, SpotCheckAnswer("x", engine, layers[19], None, neighbours), POSITIONS, ids)
    assert not caught.ok
    first = caught.checks[0]
    assert first.tensor == "aux layer 1" and not first.ok and first.dump_closest == "layer 2 (one layer late)"
    assert first.error == without.checks[0].error and first.separation < without.checks[0].separation
