"""The second opinion during a run: every Nth row is asked once more of the engine, with its own
hidden states returned, and compared with the row's dump (:mod:`hsextract.extract.checks.spot_compare`).

Which rows: the first row the run sends, then every ``spot_check_every``-th (in the order rows are
sent), so a broken setup is caught on the first row. The check runs on the row's worker thread after
the dump passed :func:`~hsextract.extract.checks.dump_checks.check_dump` and before the row is written; the
request carries a rid without the dump prefix (:func:`~hsextract.contract.spot_check.spot_check_rid`),
so nothing is dumped for it. A request that fails is counted (``result="error"``) and the row goes
on: a failed second opinion is not evidence against the dump. A request cut by the run's own stop
(which shuts every connection) is neither counted nor logged: the row is left for the next run. A
server that returns no hidden states stops the run at the first check (:class:`~hsextract.errors.SpotCheckUnavailableError`).

What a mismatch does is the ledger's (:meth:`~hsextract.extract.ledger.Ledger.spot_check_mismatch`):
the row goes to ``errors.jsonl`` (reason ``spot_check_mismatch``, what differed in the message), is
not written, and the run stops after ``spot_check_max_mismatches`` of them.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from hsextract.contract.files.dumps import Dump
from hsextract.contract.spot_check import SpotCheckRequest, spot_check_rid
from hsextract.errors import SpotCheckUnavailableError, TransientServerError
from hsextract.extract.checks.spot_compare import Comparison, TensorCheck, compare
from hsextract.extract.config import ExtractConfig
from hsextract.extract.metrics import SPOT_CHECK_RESULTS, ExtractMetrics
from hsextract.extract.requests.client import ServerClient
from hsextract.output.sample import Sample

log = logging.getLogger(__name__)


@dataclass
class TensorRecord:
    """One checked tensor over the run: how close the matching dumps were, and how far the alternatives."""

    rows: int = 0
    matched: int = 0
    differed: int = 0
    not_judged: int = 0  # rows where the tensor could not be told from another one (TensorCheck.separable)
    worst_matching_error: float = 0.0  # the largest error of a dump that matched
    smallest_separation: float = float("inf")  # the engine's state's least distance from an alternative
    nearest_alternative: str = ""  # ... which alternative that was
    least_sureness: float = float("inf")  # min over matching rows of separation / error
    worst_rounding: float = 0.0  # the largest rounding of the engine's state in the storage dtype (FP8: its shared scale)

    def add(self, check: TensorCheck) -> None:
        self.rows += 1
        self.worst_rounding = max(self.worst_rounding, check.rounding)
        if not check.separable:
            self.not_judged += 1
        elif check.ok:
            self.matched += 1
            self.worst_matching_error = max(self.worst_matching_error, check.error)
            self.least_sureness = min(self.least_sureness, check.sureness)
        else:
            self.differed += 1
        if check.separation < self.smallest_separation:
            self.smallest_separation, self.nearest_alternative = check.separation, check.nearest

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "matched": self.matched,
            "differed": self.differed,
            "not_judged": self.not_judged,
            "worst_matching_error": self.worst_matching_error,
            "smallest_separation": _finite(self.smallest_separation),
            "nearest_alternative": self.nearest_alternative,
            "least_sureness": _finite(self.least_sureness),
            "worst_rounding": self.worst_rounding,
        }

    def describe(self, tensor: str) -> str:
        if not self.matched:
            return f"{tensor}: no matching row"
        sureness = "exact" if self.least_sureness == float("inf") else f"{self.least_sureness:.3g}x apart"
        return (
            f"{tensor} {self.worst_matching_error:.2g} vs >= {self.smallest_separation:.2g} "
            f"({self.nearest_alternative}; {sureness})"
        )


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value


@dataclass
class SpotCheckCounts:
    """What the spot check did in this run (``data_config.json`` ``spot_checks``)."""

    every: int
    max_tokens: int
    margin: float
    checked: int = 0
    matched: int = 0
    mismatched: int = 0
    errors: int = 0
    positions: int = 0  # positions compared, over all checked rows
    tensors: dict[str, TensorRecord] = field(default_factory=dict)
    unchecked: set[str] = field(default_factory=set)
    mismatched_rows: list[int] = field(default_factory=list)

    @property
    def worst_matching_error(self) -> float:
        return max((t.worst_matching_error for t in self.tensors.values()), default=0.0)

    def add(self, row: int, comparison: Comparison) -> None:
        self.checked += 1
        self.positions += comparison.rows
        for check in comparison.checks:
            self.tensors.setdefault(check.tensor, TensorRecord()).add(check)
        self.unchecked.update(comparison.unchecked)
        if comparison.ok:
            self.matched += 1
        else:
            self.mismatched += 1
            self.mismatched_rows.append(row)

    def to_json(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "max_tokens": self.max_tokens,
            "margin": self.margin,
            "checked_rows": self.checked,
            "matched_rows": self.matched,
            "mismatched_rows": self.mismatched,
            "failed_requests": self.errors,
            "checked_positions": self.positions,
            "worst_matching_error": self.worst_matching_error,
            "checked_tensors": sorted(self.tensors),
            "tensors": {name: record.to_json() for name, record in sorted(self.tensors.items())},
            "not_checked": sorted(_kinds(self.unchecked)),
            "mismatched_row_ids": sorted(self.mismatched_rows),
        }

    def summary_line(self) -> str:
        if not self.every:
            return "spot check: off (--spot-check-every 0)"
        line = (
            f"spot check (1 row in {self.every}, up to {self.max_tokens} tokens each): {self.checked} rows checked, "
            f"{self.matched} matched, {self.mismatched} differed, {self.errors} requests failed"
        )
        if self.tensors:
            line += "; error of the matching dumps vs the nearest alternative (norm-wise, median over positions): " + (
                "; ".join(record.describe(name) for name, record in sorted(self.tensors.items()))
            )
        if self.unchecked:
            line += "; not checked: " + "; ".join(sorted(_kinds(self.unchecked)))
        return line


def _kinds(unchecked: set[str]) -> set[str]:
    """One entry per kind: "positions 0..191 (...)" of many rows is said once, without the numbers."""
    kinds = set()
    for text in unchecked:
        head, _, why = text.partition(" (")
        kinds.add(f"some positions ({why}" if head.startswith("positions ") else text)
    return kinds


class SpotChecker:
    """Decides which rows are checked and checks them; one instance serves every worker thread."""

    def __init__(
        self, config: ExtractConfig, client: ServerClient, metrics: ExtractMetrics, layer_ids: list[int],
        stop: threading.Event | None = None,
    ) -> None:  # fmt: skip
        self.every = config.spot_check_every
        self.max_tokens = config.spot_check_max_tokens
        self.margin = config.spot_check_margin
        self.client = client
        self.metrics = metrics
        self.layer_ids = list(layer_ids)
        self.stop = stop or threading.Event()
        self._unjudged_said: set[str] = set()
        self.counts = SpotCheckCounts(self.every, self.max_tokens, self.margin)
        self._sent = itertools.count()
        self._lock = threading.Lock()
        metrics.spot_check_every.set(self.every)

    def due(self) -> bool:
        """Whether the row about to be sent is checked (the first, then every Nth)."""
        if not self.every:
            return False
        with self._lock:
            return next(self._sent) % self.every == 0

    def check(self, sample: Sample, dump: Dump, attempt: int = 0) -> Comparison | None:
        """The comparison of ``dump`` with the engine's own states of the row; None when the request failed."""
        ids = sample.input_ids[: self.max_tokens]
        request = SpotCheckRequest(spot_check_rid(sample.row, len(sample.input_ids), attempt), ids)
        try:
            with self.metrics.stage("spot_check"):
                answer = self.client.spot_check(request)
        except TransientServerError as exc:
            if self.stop.is_set():  # the run stops and shut its connections: not a failed check, the row is not written
                return None
            log.warning("row %d: the spot check request failed (%s); the row goes on unchecked", sample.row, exc)
            self._count("error")
            return None
        try:
            comparison = compare(dump, answer, len(ids), self.layer_ids, self.margin)
        except ValueError as exc:  # every further answer would be just as unreadable
            raise SpotCheckUnavailableError(
                f"the spot check of row {sample.row} cannot read the engine's answer: {exc}; run with --spot-check-every 0 "
                "against this server"
            ) from None
        with self._lock:
            self.counts.add(sample.row, comparison)
            unjudged = [c for c in comparison.checks if not c.separable and c.tensor not in self._unjudged_said]
            self._unjudged_said.update(c.tensor for c in unjudged)
        for check in unjudged:
            log.warning("row %d spot check: %s (said once per tensor; the summary counts the rows)", sample.row, check.describe())
        self._count("match" if comparison.ok else "mismatch")
        if comparison.ok:
            log.debug("row %d spot check: %s", sample.row, comparison.describe())
        return comparison

    def _count(self, result: str) -> None:
        assert result in SPOT_CHECK_RESULTS
        self.metrics.spot_checks.labels(result).inc()
        if result == "error":
            with self._lock:
                self.counts.errors += 1
