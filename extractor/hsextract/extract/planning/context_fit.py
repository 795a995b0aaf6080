"""Rows the served model cannot take: still as long as its context after the cut to ``--max-seq-len``.

Sent anyway, SGLang refuses them (HTTP 400) and the embedded server runs a forward past every position the
model knows (minutes for a 250 k-token row, ending in a timeout that a rerun repeats). They are recorded as bad
input (``longer_than_context``) before any request instead, with the cut that would make them fit.
"""

from __future__ import annotations

import logging

from hsextract.contract.context_length import longest_prompt
from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError
from hsextract.output.sample import Sample

log = logging.getLogger(__name__)


def check_fits_context(sample: Sample, context_length: int | None, max_seq_len: int) -> None:
    """BadSampleError (``longer_than_context``) for a sample, already cut to ``max_seq_len``, that the server of
    ``context_length`` would refuse; nothing when it fits or the context is unknown."""
    if context_length is None or len(sample.input_ids) <= longest_prompt(context_length):
        return
    longest = longest_prompt(context_length)
    cut = f" after the cut to --max-seq-len {max_seq_len}" if sample.truncated else ""
    raise BadSampleError(
        ErrorReason.LONGER_THAN_CONTEXT,
        f"row {sample.row}: {len(sample.input_ids)} tokens{cut}, but the served model's context is {context_length} tokens "
        f"(a prompt takes at most {longest}); not sent. Prepare shorter rows, or cut them to fit with --max-seq-len "
        f"{longest} (a new --output)",
    )


def log_context_limit(context_length: int | None, max_seq_len: int) -> None:
    """Say at start when rows can be refused for the context, or cannot be checked against it."""
    if context_length is None:
        log.info(
            "the server reports no context length and its model's config.json is not readable here: rows are not "
            "checked against the model's context"
        )
    elif max_seq_len > longest_prompt(context_length):
        log.warning(
            "--max-seq-len %d is not below the served model's context of %d tokens: rows still longer than %d tokens "
            "after the cut are recorded as bad input (longer_than_context), not sent; --max-seq-len %d cuts them to fit",
            max_seq_len,
            context_length,
            longest_prompt(context_length),
            longest_prompt(context_length),
        )
