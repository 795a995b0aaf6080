"""A row that is not JSON has one reason in every errors file and metric label (issue 29 item 14): prepare and
regenerate wrote "not JSON", extract "not_json"; it is "not_json" everywhere (extract's errors.jsonl of older
outputs keeps reading)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from hsextract.contract.states import ErrorReason
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.planning.dataset import iter_rows
from hsextract.prepare.conversation import BadRow
from hsextract.prepare.readers import open_input
from hsextract.regen.metrics import RegenMetrics


def _reason_labels(registry: CollectorRegistry, metric: str) -> set[str]:
    return {s.labels["reason"] for m in registry.collect() if m.name == metric for s in m.samples if "reason" in s.labels}


def test_a_line_that_is_not_json_has_one_reason_in_prepare_regenerate_and_extract(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text('{"input_ids": [1, 2]}\n{not json\n')
    extract_reason = next(r.raw for r in iter_rows(dataset) if r.row == 1).reason
    prepare_rows = dict(open_input(dataset).iter_rows())
    assert isinstance(prepare_rows[1], BadRow)
    assert extract_reason == prepare_rows[1].reason == "not_json" == ErrorReason.NOT_JSON.value
    extract_registry, regen_registry = CollectorRegistry(), CollectorRegistry()
    ExtractMetrics(extract_registry)
    RegenMetrics(regen_registry)
    for labels in (_reason_labels(extract_registry, "hsextract_errors"),
                   _reason_labels(regen_registry, "hsextract_regen_errors")):
        assert "not_json" in labels and "not JSON" not in labels
