"""Rows the served model cannot take (issue 39, item 3): still too long for its context after the cut to
--max-seq-len, they are bad input (longer_than_context), never sent."""

from __future__ import annotations

import logging

import pytest

from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError
from hsextract.extract.planning.context_fit import check_fits_context, log_context_limit
from hsextract.extract.planning.dataset import validate_row
from hsextract.output.sample import Sample


def _sample(tokens: int, max_seq_len: int) -> Sample:
    return validate_row(3, {"input_ids": [1] * tokens}, vocab_size=10, max_seq_len=max_seq_len)


def test_a_row_shorter_than_the_context_fits() -> None:
    check_fits_context(_sample(63, max_seq_len=100), context_length=64, max_seq_len=100)


def test_a_row_cut_below_the_context_by_max_seq_len_fits() -> None:
    check_fits_context(_sample(150, max_seq_len=50), context_length=64, max_seq_len=50)


@pytest.mark.parametrize(("tokens", "after_cut"), [(64, 64), (150, 100)])
def test_a_row_still_as_long_as_the_context_after_the_cut_is_bad_input(tokens: int, after_cut: int) -> None:
    with pytest.raises(BadSampleError) as caught:
        check_fits_context(_sample(tokens, max_seq_len=100), context_length=64, max_seq_len=100)
    assert caught.value.reason is ErrorReason.LONGER_THAN_CONTEXT
    message = str(caught.value)
    assert f"row 3: {after_cut} tokens" in message and "context is 64 tokens" in message
    assert ("after the cut to --max-seq-len 100" in message) == (tokens > 100)
    assert "--max-seq-len 63" in message  # the fix


def test_an_unknown_context_checks_nothing() -> None:
    check_fits_context(_sample(10_000, max_seq_len=100_000), context_length=None, max_seq_len=100_000)


def test_the_start_says_when_rows_can_be_refused_or_go_unchecked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hsextract.extract.planning.context_fit"):
        log_context_limit(context_length=64, max_seq_len=32)
        assert not caplog.records  # the cut keeps every row within the context
        log_context_limit(context_length=64, max_seq_len=100)
        log_context_limit(context_length=None, max_seq_len=100)
    assert "--max-seq-len 100" in caplog.records[0].getMessage() and "longer_than_context" in caplog.records[0].getMessage()
    assert "not checked" in caplog.records[1].getMessage()
