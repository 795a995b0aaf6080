"""The ledger: rows recorded in the manifest and the metrics, the breaker, the fatal stop, the outcome."""

from __future__ import annotations

import threading
from pathlib import Path

from hsextract.contract.states import ErrorReason, RunStatus
from hsextract.errors import BadSampleError, DumpError, LayerMismatchError, WrongServerError
from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.output.checksum import WrittenFile
from hsextract.output.manifest import Manifest
from hsextract.output.sample import Sample


def _ledger(tmp_path: Path, max_consecutive_failures: int = 3) -> Ledger:
    return Ledger(
        Manifest(tmp_path),
        ExtractMetrics(),
        tmp_path,
        threading.Event(),
        max_attempts=2,
        max_consecutive_failures=max_consecutive_failures,
        server_url="http://server",
    )


def _sample(row: int) -> Sample:
    return Sample(row=row, input_ids=[1, 2, 3], loss_mask=[1, 1, 1], original_length=3)


def test_rows_land_in_the_manifest_and_the_metrics(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.written("rows/data_0.ckpt", _sample(0), "h0", WrittenFile(100, "c0"), 0.5)
    ledger.bad_input(1, "h1", BadSampleError(ErrorReason.NOT_JSON, "row 1 is not JSON"))
    ledger.failed(2, "h2", DumpError(ErrorReason.DUMP_TIMEOUT, "no dump"))
    value = ledger.metrics.registry.get_sample_value
    assert value("hsextract_samples_total", {"status": "ok"}) == 1
    assert value("hsextract_samples_total", {"status": "bad_input"}) == 1
    assert value("hsextract_samples_total", {"status": "failed"}) == 1
    assert value("hsextract_tokens_total") == 3
    assert set(ledger.manifest.written) == {0} and set(ledger.manifest.errors) == {1, 2}
    assert ledger.manifest.errors[2].reason == ErrorReason.DUMP_TIMEOUT
    assert (ledger.written_now, ledger.failed_now) == (1, 1)
    assert ledger.outcome() == (RunStatus.INCOMPLETE, None)
    assert ledger.fanned_out.is_set()


def test_the_breaker_stops_after_consecutive_failures_and_a_success_resets_it(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, max_consecutive_failures=2)
    ledger.failed(0, "h", None)
    ledger.written("rows/data_1.ckpt", _sample(1), "h", WrittenFile(1, "c"), 0.1)
    ledger.failed(2, "h", None)
    assert not ledger.stop.is_set()
    ledger.failed(3, "h", None)
    assert ledger.stop.is_set()
    status, reason = ledger.outcome()
    assert status is RunStatus.STOPPED and reason is not None and "2 samples in a row failed" in reason


def test_the_first_fatal_error_wins_and_outranks_an_interrupt(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.request_stop("SIGTERM")
    assert ledger.outcome()[0] is RunStatus.INTERRUPTED
    ledger.stop_fatal(WrongServerError("first"))
    ledger.stop_fatal(LayerMismatchError(ErrorReason.LAYER_MISMATCH, "second"))
    assert ledger.outcome() == (RunStatus.STOPPED, "WrongServerError: first")


def test_late_answers_and_dump_pickups_are_counted(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.dump_picked_up(0.25)
    ledger.dump_picked_up(-0.01)  # a clock step between hosts: never negative
    ledger.answer_late(7, "hsx-000000007-n3", 2.0)
    assert ledger.longest_dump_pickup_s == 0.25 and ledger.late_answers == 1
    assert ledger.metrics.registry.get_sample_value("hsextract_late_answers_total") == 1
    assert ledger.metrics.registry.get_sample_value("hsextract_dump_pickup_seconds_count") == 2


def test_fatal_and_retryable_are_properties_of_the_error_types() -> None:
    assert WrongServerError("x").fatal and LayerMismatchError(ErrorReason.LAYER_MISMATCH, "x").fatal
    assert DumpError(ErrorReason.DUMP_TIMEOUT, "x").retryable
    assert not LayerMismatchError(ErrorReason.LAYER_MISMATCH, "x").retryable
    assert not BadSampleError(ErrorReason.NOT_JSON, "x").retryable
