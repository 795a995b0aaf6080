"""``hsextract prepare``: conversations in, a trainer's tokenized rows out (see ``docs/data.md``).

Order of work: the input and the tokenizer are opened and checked, the SpecForge template resolved,
an existing output checked, all before any row is read; rows are read and tokenized a chunk at a
time; nothing is written until a chunk gives a usable row (an input with none stops, writing
nothing); each chunk is then one part of the resumable writer (``writer.py``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from hsextract import __version__
from hsextract.contract.context_length import context_length_of, longest_prompt
from hsextract.contract.model_config import read_model_config
from hsextract.errors import ConfigError
from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.conversation import BadRow, Conversation, conversation_of
from hsextract.prepare.model_tokenizer import load_model_tokenizer
from hsextract.prepare.provenance import ERRORS_FILE, Provenance, Settings, read_provenance
from hsextract.prepare.readers import InputDataset, open_input
from hsextract.prepare.registry import resolve_template
from hsextract.prepare.rows import Convention, Outcome
from hsextract.prepare.specforge import SpecForgeConvention
from hsextract.prepare.speculators import SpeculatorsConvention
from hsextract.prepare.writer import PartRecord, PreparedWriter

log = logging.getLogger(__name__)


@dataclass
class PrepareSummary:
    output: str
    like: str
    specforge_template: str | None
    already_complete: bool = False
    counts: dict[str, Any] = field(default_factory=dict)
    resumed_rows: int = 0
    seconds: float = 0.0


def totals(records: list[PartRecord], rows_in: int) -> dict[str, Any]:
    """The counts of prepare.json, summed over the parts."""
    dropped: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    for record in records:
        dropped.update(record.dropped)
        notes.update(record.notes)
    return {
        "rows_in": rows_in,
        "rows_out": sum(r.rows_out for r in records),
        "conversations_used": sum(r.conversations_used for r in records),
        "dropped": dict(sorted(dropped.items())),
        "dropped_total": sum(dropped.values()),
        "truncated": sum(r.truncated for r in records),
        "no_supervised_token": notes.get("no supervised token", 0),
        "notes": dict(sorted(notes.items())),
        "tokens": sum(r.tokens for r in records),
        "supervised_tokens": sum(r.supervised_tokens for r in records),
    }


def _convention(config: PrepareConfig, tokenizer: Any) -> tuple[Convention, str | None]:
    if config.convention == "specforge":
        template = resolve_template(config.specforge_template, tokenizer, str(config.model))
        return SpecForgeConvention(tokenizer, template, config.max_seq_len), template.name
    if config.specforge_template is not None:
        raise ConfigError(
            f"--specforge-template {config.specforge_template} applies to --like specforge only; speculators renders "
            "with the model's own template: drop it"
        )
    return SpeculatorsConvention(tokenizer, config.max_seq_len), None


def _chunks(source: InputDataset, start: int, size: int) -> Iterator[list[tuple[int, Any]]]:
    rows = source.iter_rows(start)
    while chunk := list(islice(rows, size)):
        yield chunk


def _prepare_chunk(convention: Convention, chunk: list[tuple[int, Any]]) -> list[Outcome]:
    outcomes: dict[int, Outcome] = {}
    good: list[Conversation] = []
    for row, raw in chunk:
        try:
            good.append(conversation_of(row, raw))
        except BadRow as exc:
            outcomes[row] = Outcome(row, error=exc)
    for outcome in convention.prepare(good):
        outcomes[outcome.source_row] = outcome
    return [outcomes[row] for row, _ in chunk]


def _no_usable_row(pending: list[list[Outcome]], source: InputDataset) -> ConfigError:
    reasons: Counter[str] = Counter(o.error.reason for chunk in pending for o in chunk if o.error is not None)
    first = next((o.error.message for chunk in pending for o in chunk if o.error is not None), "the input is empty")
    listed = ", ".join(f"{reason}: {count}" for reason, count in reasons.most_common()) or "no rows"
    return ConfigError(
        f"--dataset {source.path} has no usable row ({listed}; first: {first}); nothing was written. Give rows with a "
        "conversations or messages list of user and assistant turns (docs/data.md)"
    )


def warn_beyond_context(config: PrepareConfig) -> None:
    """Say when ``--max-seq-len`` keeps rows too long for the model's context (its config.json), which extract then
    records as bad input instead of sending. A warning, not a refusal: a server may be started with another context
    (SGLang's --context-length), and extract checks every row against the served one."""
    context = context_length_of({}, read_model_config(config.model))
    if context is None or config.max_seq_len <= longest_prompt(context):
        return
    log.warning(
        "--max-seq-len %d is not below the context of %s (max_position_embeddings %d in its config.json): rows longer "
        "than %d tokens are kept, and extract records them as bad input (longer_than_context) instead of sending them; "
        "--max-seq-len %d cuts them to fit",
        config.max_seq_len,
        config.model,
        context,
        longest_prompt(context),
        longest_prompt(context),
    )


def run_prepare(config: PrepareConfig) -> PrepareSummary:
    started = time.monotonic()
    source = open_input(config.dataset, config.split)
    model_tokenizer = load_model_tokenizer(config.model, config.chat_template, config.trust_remote_code)
    convention, template_name = _convention(config, model_tokenizer.tokenizer)
    warn_beyond_context(config)
    settings = Settings(
        like=config.convention,
        specforge_template=template_name,
        max_seq_len=config.max_seq_len,
        tokenizer_fingerprint=model_tokenizer.fingerprint,
        chat_template_sha256=model_tokenizer.template_sha256,
        chat_template_source=model_tokenizer.template_source,
        vocab_size=model_tokenizer.vocab_size,
        input_path=str(source.path),
        input_split=source.split,
        input_fingerprint=source.fingerprint,
        input_rows=source.num_rows,
        chunk_rows=config.chunk_rows,
    )
    summary = PrepareSummary(str(config.output), config.convention, template_name)
    writer = PreparedWriter(config.output, settings, progress=config.progress)
    if writer.check_output():
        done = read_provenance(config.output)
        summary.already_complete, summary.counts = True, dict(done.counts) if done else {}
        return summary
    records = writer.open() if writer.started() else []
    try:
        next_row = records[-1].end_row if records else 0
        summary.resumed_rows = next_row
        log.info("preparing %s rows of %s like %s%s into %s%s", source.num_rows, source.path, config.convention,
                 f" (SpecForge template {template_name})" if template_name else "", config.output,
                 f", resuming at row {next_row}" if next_row else "")
        pending: list[tuple[int, int, list[Outcome]]] = []  # chunks before the first usable row, not yet written
        from tqdm import tqdm

        with tqdm(total=source.num_rows, initial=next_row, unit="row", disable=not config.progress,
                  desc="prepare") as bar:
            for chunk in _chunks(source, next_row, config.chunk_rows):
                outcomes = _prepare_chunk(convention, chunk)
                pending.append((chunk[0][0], chunk[-1][0] + 1, outcomes))
                if not records and not any(o.rows for _, _, c in pending for o in c):
                    bar.update(len(chunk))
                    continue
                if not writer.is_open:
                    records = writer.open()
                for first, end, part_outcomes in pending:
                    records.append(writer.write_part(len(records), first, end, part_outcomes))
                pending.clear()
                bar.update(len(chunk))
        if not records:
            raise _no_usable_row([c for _, _, c in pending], source)
        summary.counts = totals(records, source.num_rows)
        writer.finish(records, Provenance(settings, summary.counts, __version__, model=str(Path(config.model).resolve()),
                                          trust_remote_code=config.trust_remote_code))
    finally:
        writer.close()
    summary.seconds = time.monotonic() - started
    log.info("prepared %s: %d rows out of %d input rows; errors in %s/%s", config.output, summary.counts["rows_out"],
             source.num_rows, config.output, ERRORS_FILE)
    return summary
