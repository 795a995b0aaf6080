"""The acceptance curve of ``bench_gpu_drafter`` and its verdict, from every size measured so far.

Sizes may come from several device calls (each size's figures are kept in the results file under
``sizes``); the curve and the verdict are always recomputed from all of them:

* ``curve(sizes)``: ``{kind: {drafter: {size: expected acceptance length}}}``;
* ``verdict(curve, lookup)``: the issue's targets, per held-out kind. At the largest size, the best
  correct-data drafter at least :data:`TARGETS` ``over_prompt_lookup`` x prompt lookup; at every size
  where both were measured, speculators bf16 above the layer-off drafter and at least ``over_shifted`` x
  the shifted one, FP8 within ``fp8_within`` of bf16; each curve drafter's acceptance rising with
  every larger size (three sizes at least). Drafters whose trainer was stopped at the call's deadline
  are named per size (``cut_short``): such a point understates its drafter. A comparison at one size
  counts only between drafters trained for the same epochs (``epochs``); the curve reports each size's.
"""

from __future__ import annotations

import itertools
from typing import Any

TARGETS = {"over_prompt_lookup": 1.3, "over_layer_off": 1.0, "over_shifted": 1.5, "fp8_within": 0.05, "min_sizes": 3}
#: trained at every size: the curve
CURVE = ("speculators_bf16", "specforge_bf16")
#: trained from correct data (FP8 and the wrong-data drafters at the largest size only)
CORRECT = ("speculators_bf16", "specforge_bf16", "speculators_fp8")


def tau(measured: dict[str, Any] | None) -> float | None:
    value = (measured or {}).get("expected_acceptance_length")
    return float(value) if value is not None else None


def curve(sizes: dict[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
    """Every measured drafter's expected acceptance length, by held-out kind, drafter and size."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for size in sorted(sizes, key=int):
        for kind, drafters in (sizes[size].get("evaluation") or {}).items():
            for name, measured in drafters.items():
                value = tau(measured)
                if value is not None:
                    out.setdefault(kind, {}).setdefault(name, {})[int(size)] = value
    return out


def cut_short(sizes: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    """By size, the drafters whose trainer the deadline stopped, with how far each got."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for size, parts in sizes.items():
        for part, job in parts.items():
            if part.startswith("train_") and isinstance(job, dict) and "stopped_at_deadline_s" in job:
                kept = {k: job[k] for k in ("stopped_at_deadline_s", "epochs_done", "last_step") if k in job}
                out.setdefault(int(size), {})[part.removeprefix("train_")] = kept
    return out


def epochs(sizes: dict[str, Any]) -> dict[int, dict[str, int]]:
    """By size, the epochs each drafter was trained for (sizes measured by different calls may differ)."""
    out: dict[int, dict[str, int]] = {}
    for size, parts in sizes.items():
        for part, job in parts.items():
            if part.startswith("train_") and isinstance(job, dict) and job.get("epochs") is not None:
                out.setdefault(int(size), {})[part.removeprefix("train_")] = int(job["epochs"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def verdict(
    curves: dict[str, dict[str, dict[int, float]]],
    lookup: dict[str, float],
    stopped: dict[int, dict[str, dict[str, Any]]] | None = None,
    trained_epochs: dict[int, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The targets checked per held-out kind; ``all_passed`` only when every check was measured and passed.
    ``stopped`` (:func:`cut_short`) is reported at the largest size, not judged. ``trained_epochs``
    (:func:`epochs`): a comparison at a size is like for like only when both drafters were trained for
    the same epochs, so a pair that differs fails its check, named; the curve reports each size's epochs."""
    trained_epochs = trained_epochs or {}

    def unequal(size: int, a: str, b: str) -> bool:
        known = trained_epochs.get(size, {})
        return a in known and b in known and known[a] != known[b]

    out: dict[str, Any] = {"targets": TARGETS, "kinds": {}}
    for kind, drafters in sorted(curves.items()):
        pl = lookup.get(kind)
        sizes = sorted({size for name in CURVE for size in drafters.get(name, {})})
        largest = sizes[-1] if sizes else None
        checks: dict[str, Any] = {"prompt_lookup": pl, "largest_size": largest}
        checks["cut_short_at_largest"] = (stopped or {}).get(largest, {}) if largest is not None else {}
        at_largest = {name: drafters[name][largest] for name in CORRECT if largest in drafters.get(name, {})}
        best = max(at_largest, key=lambda name: at_largest[name]) if at_largest else None
        ratio = _ratio(at_largest.get(best) if best else None, pl)
        checks["best_over_prompt_lookup"] = {
            "drafter": best,
            "ratio": ratio,
            "passed": ratio is not None and ratio >= TARGETS["over_prompt_lookup"],
        }
        bf16 = drafters.get("speculators_bf16", {})
        # above the layer-off drafter (strictly), at least 1.5 x the shifted one
        for other, name, beats in (
            ("speculators_layer_off", "bf16_over_layer_off", lambda r: r > TARGETS["over_layer_off"]),
            ("speculators_shifted", "bf16_over_shifted", lambda r: r >= TARGETS["over_shifted"]),
        ):
            ratios = {s: _ratio(bf16[s], v) for s, v in drafters.get(other, {}).items() if s in bf16}
            mixed = sorted(s for s in ratios if unequal(s, "speculators_bf16", other))
            checks[name] = {
                "ratios": ratios,
                "passed": bool(ratios) and not mixed and all(r is not None and beats(r) for r in ratios.values()),
            }
            if mixed:
                checks[name]["epochs_differ_at"] = mixed
        fp8 = {s: _ratio(v, bf16[s]) for s, v in drafters.get("speculators_fp8", {}).items() if s in bf16}
        mixed = sorted(s for s in fp8 if unequal(s, "speculators_bf16", "speculators_fp8"))
        checks["fp8_vs_bf16"] = {
            "ratios": fp8,
            "passed": bool(fp8)
            and not mixed
            and all(r is not None and abs(r - 1) <= TARGETS["fp8_within"] for r in fp8.values()),
        }
        if mixed:
            checks["fp8_vs_bf16"]["epochs_differ_at"] = mixed
        rising = {}
        for name in CURVE:
            points = [drafters[name][s] for s in sorted(drafters.get(name, {}))]
            per_size = {s: trained_epochs.get(s, {}).get(name) for s in sorted(drafters.get(name, {}))}
            rising[name] = {
                "sizes": sorted(drafters.get(name, {})),
                "epochs": {s: n for s, n in per_size.items() if n is not None},
                "passed": len(points) >= TARGETS["min_sizes"] and all(b > a for a, b in itertools.pairwise(points)),
            }
        checks["rising_with_data"] = rising
        checks["passed"] = all(
            c["passed"] for key, c in checks.items() if isinstance(c, dict) and "passed" in c
        ) and all(r["passed"] for r in rising.values())
        out["kinds"][kind] = checks
    out["all_passed"] = bool(out["kinds"]) and all(c["passed"] for c in out["kinds"].values())
    return out
