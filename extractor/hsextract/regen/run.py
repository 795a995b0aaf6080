"""``hsextract regenerate``: the run loop (docs/regenerate.md).

Order of work: the input is opened, the server's health awaited and its model read, the tokenizer and
chat template loaded, the stop ids found, the identity checked against the journal, all before any
request. Then ``concurrency`` worker threads each take a conversation and regenerate its turns one
after the other (a turn's prompt holds the answers before it); each settled row is appended to the
journal at once. Once every row is settled (none left to retry), OUT is written from the journal.

Accounting: every input row ends ``ok`` (in OUT), ``failed`` (a bad row, a prompt the server refused,
or the server's tries exhausted: retried by a rerun) or ``skipped`` (``--drop-truncated``, or no
assistant turn to regenerate), so ok + failed + skipped = input rows.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hsextract import __version__
from hsextract.contract.generate import GenerationRequest, SamplingParams
from hsextract.contract.model_fingerprint import model_fingerprint
from hsextract.errors import BadRequestError, ConfigError, ServerError, ServerUnreachableError, TransientServerError
from hsextract.ports import check_metrics_port
from hsextract.prepare.conversation import BadRow
from hsextract.prepare.model_tokenizer import load_model_tokenizer
from hsextract.prepare.readers import open_input
from hsextract.regen.client import RID_PREFIX, SERVER_ERROR, SERVER_REFUSED, DecodeAnswer, GenerateClient, make_rid
from hsextract.regen.config import RegenerateConfig
from hsextract.regen.conversation import NO_ASSISTANT_TURN, TRUNCATED, Regenerated, regenerate_row, turn_seed
from hsextract.regen.input_shape import check_conversations
from hsextract.regen.journal import FAILED, IDENTITY_FILE, OK, SKIPPED, SUMMARY_FILE, Journal, RegenIdentity
from hsextract.regen.metrics import RegenMetrics
from hsextract.regen.prompts import Prompter, stop_token_ids
from hsextract.regen.writer import read_summary, write_errors, write_output, write_summary

log = logging.getLogger(__name__)

#: the reason of a row whose request failed on every try (retried by a rerun)
COMPLETE, ALREADY_COMPLETE, INCOMPLETE, INTERRUPTED = "complete", "already complete", "incomplete", "interrupted"


class _Stopping(Exception):
    """The run is stopping: this row is left unsettled (the next run does it)."""


class _Exhausted(Exception):
    """Every try of one request failed on a transient server error."""


@dataclass
class RegenSummary:
    output: str
    journal: str
    status: str = INCOMPLETE
    model: str = ""
    counts: dict[str, Any] = field(default_factory=dict)
    resumed: int = 0
    seconds: float = 0.0
    stop_reason: str = ""


def tally(journal: Journal, rows: Sequence[int]) -> dict[str, Any]:
    """The counts of the summary, over the run's rows (the shard's, or all)."""
    status: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {FAILED: Counter(), SKIPPED: Counter()}
    turns = truncated = tokens = 0
    for row in rows:
        settled = journal.settled.get(row)
        if settled is None:
            status["pending"] += 1
            continue
        status[settled.status] += 1
        if settled.status in reasons:
            reasons[settled.status][settled.reason or "unknown"] += 1
        turns += settled.turns
        truncated += settled.truncated_turns
        tokens += settled.generated_tokens
    return {
        "rows_in": len(rows),
        "ok": status[OK],
        "failed": status[FAILED],
        "skipped": status[SKIPPED],
        "pending": status["pending"],
        "failed_by_reason": dict(sorted(reasons[FAILED].items())),
        "skipped_by_reason": dict(sorted(reasons[SKIPPED].items())),
        "retryable": sum(1 for row in rows if row in journal.settled and journal.settled[row].retryable),
        "turns_regenerated": turns,
        "truncated_turns": truncated,
        "generated_tokens": tokens,
    }


def completed(config: RegenerateConfig) -> dict[str, Any] | None:
    """The summary of a complete output made with these settings, read without the server (None: not
    complete, or made otherwise). ``hsextract pipeline`` skips the step on it: the regeneration server
    is usually gone by the time a later step is rerun."""
    summary = read_summary(config.journal_dir)
    if summary is None or not config.output.is_file():
        return None
    identity = summary.get("identity") or {}
    sampling = {k: v for k, v in (identity.get("sampling") or {}).items() if k != "stop_token_ids"}
    same = (
        sampling == config.sampling()
        and identity.get("turns") == config.turns
        and identity.get("reasoning") == config.reasoning
        and identity.get("enable_thinking") == config.enable_thinking
        and identity.get("drop_truncated") == config.drop_truncated
        and (identity.get("shard_index", 0), identity.get("num_shards", 1)) == (config.shard_index, config.num_shards)
    )
    if not same:
        return None
    if identity.get("input_path") == str(config.dataset.resolve()):
        return summary
    # another path (a merge of shards made in containers, a moved input): the same input if its content is
    return summary if _input_fingerprint(config) == identity.get("input_fingerprint") else None


def _input_fingerprint(config: RegenerateConfig) -> str | None:
    try:
        return open_input(config.dataset, config.split).fingerprint
    except ConfigError:
        return None


def check_output(config: RegenerateConfig) -> None:
    """Refuse an --output that is the input, or an existing file this command did not write: OUT is replaced at
    the end, so either would be lost. A resume of regenerate's own output is let through."""
    output = config.output
    if _same_file(output, config.dataset):
        raise ConfigError(
            f"--output {output} is the input (--dataset {config.dataset}): regenerate replaces OUT at the end, so the "
            "input would be lost. Nothing was sent; give another --output (a new file)"
        )
    if output.exists() and not _is_own_output(config.journal_dir):
        raise ConfigError(
            f"--output {output} exists and is no output of hsextract regenerate (no {IDENTITY_FILE} or {SUMMARY_FILE} "
            f"in {config.journal_dir}): it would be overwritten. Nothing was sent; give another --output (a new file), "
            "or move that file away"
        )


def _same_file(one: Path, other: Path) -> bool:
    """One file, however named: the same path once resolved (symlinks, ``..``), or the same inode (a hard link)."""
    if one.resolve() == other.resolve():
        return True
    try:
        return os.path.samefile(one, other)
    except OSError:  # one of them does not exist
        return False


def _is_own_output(journal_dir: Path) -> bool:
    """Whether OUT's journal is regenerate's (a run's identity, or the summary a run or merge-regenerated wrote)."""
    return (journal_dir / IDENTITY_FILE).is_file() or (journal_dir / SUMMARY_FILE).is_file()


def _done_before(journal: Journal, rows: Sequence[int]) -> int:
    """How many of the run's rows an earlier run settled for good (all of them for a complete output)."""
    return sum(1 for row in rows if journal.done(row))


def _bad_row_record(base: dict[str, Any], exc: BadRow) -> dict[str, Any]:
    """The journal record of a row that is no conversation to regenerate. One with no assistant turn is
    skipped, not failed: there is nothing to answer again (prepare drops it too), so it is bad input a
    rerun cannot fix and no reason to exit 3; the other bad rows fail until the input is fixed."""
    status = SKIPPED if exc.reason == NO_ASSISTANT_TURN else FAILED
    return {**base, "status": status, "reason": exc.reason, "message": exc.message}


class Regeneration:
    def __init__(self, config: RegenerateConfig, metrics: RegenMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or RegenMetrics()
        self.stop = threading.Event()
        self.stop_reason = ""
        self.run_token = uuid.uuid4().hex[:8]
        self._fatal: BaseException | None = None
        self._outage = threading.Lock()
        self.client: GenerateClient | None = None

    def request_stop(self, reason: str) -> None:
        """Stop sending (a signal): rows in flight are cancelled and left for the next run."""
        if not self.stop.is_set():
            self.stop_reason = f"stopped by {reason}: rerun the same command to resume"
            self.stop.set()
            if self.client is not None:
                self.client.cancel()

    # -- setup -------------------------------------------------------------------------------------
    def _model_dir(self, model_path: str) -> Path:
        if self.config.model is not None:
            return self.config.model
        if model_path and Path(model_path).is_dir():
            return Path(model_path)
        raise ConfigError(
            f"the server serves {model_path or 'a model it does not name'}, which is no directory here; give the model "
            "directory with --model (its tokenizer and chat template render the prompts)"
        )

    def _prompter(self, model_dir: Path) -> tuple[Prompter, Any]:
        config = self.config
        model = load_model_tokenizer(model_dir, config.chat_template, config.trust_remote_code)
        stops = stop_token_ids(model, model_dir)
        if not stops:
            raise ConfigError(
                f"the tokenizer of {model_dir} has no EOS token and its chat template writes no special token after an "
                "answer: generation would not stop; give a model with an end-of-turn token or --chat-template FILE"
            )
        kwargs = {} if config.enable_thinking is None else {"enable_thinking": config.enable_thinking}
        return Prompter(model, stops, kwargs), model

    def _probe(self, prompter: Prompter) -> None:
        """One token generated for a short prompt, before any row: a server that does not decode (an
        embedded server without generation, a prefill-only endpoint) stops the run here, not row by row."""
        assert self.client is not None
        prompt = prompter.prompt_ids([{"role": "user", "content": "hello"}], None)
        sampling = SamplingParams(max_new_tokens=1, temperature=0.0, stop_token_ids=tuple(prompter.stop_ids))
        request = GenerationRequest(f"{RID_PREFIX}-{self.run_token}-probe-0", prompt, sampling)
        for attempt in range(self.config.max_attempts):
            try:
                self.client.generate(request)
                return
            except BadRequestError as exc:
                raise ConfigError(
                    f"the server at {self.config.server} does not generate for a 1-token request: {exc}; serve the "
                    "model with a server that decodes (SGLang, or hsextract serve with generation)"
                ) from None
            except TransientServerError as exc:
                if attempt + 1 == self.config.max_attempts:
                    raise ServerError(f"the server at {self.config.server} fails a 1-token request: {exc}") from None
                request = replace(request, rid=f"{RID_PREFIX}-{self.run_token}-probe-{attempt + 1}")
                if self.stop.wait(self.config.retry_backoff_s):
                    raise KeyboardInterrupt from None

    # -- one request, one row ----------------------------------------------------------------------
    def _wait_for_server(self, cause: Exception) -> None:
        assert self.client is not None
        with self._outage:
            if self.stop.is_set():
                raise _Stopping
            if self.client.server.reachable():
                return
            self.metrics.server_up.set(0)
            log.warning("the server stopped taking connections (%s); waiting up to %.0f s for it", cause,
                        self.config.server_down_timeout_s)
            try:
                self.client.server.wait_until_healthy(self.config.server_down_timeout_s, self.stop)
            except KeyboardInterrupt:
                raise _Stopping from None
            except ServerError as exc:
                raise ServerError(f"the server stopped taking connections mid-run and did not come back: {exc}. No row "
                                  "was failed for it: start the server, then rerun the same command") from None
            self.metrics.server_up.set(1)

    def _send(self, row: int, turn: int, prompt: list[int], prompter: Prompter) -> DecodeAnswer:
        assert self.client is not None
        config = self.config
        seed = None if config.seed is None else turn_seed(config.seed, row, turn)
        sampling = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, config.top_k,
                                  tuple(prompter.stop_ids), seed)
        attempt = failures = 0
        while True:
            if self.stop.is_set():
                raise _Stopping
            attempt += 1
            request = GenerationRequest(make_rid(self.run_token, row, turn, attempt), prompt, sampling)
            self.metrics.inflight.inc()
            started = time.monotonic()
            try:
                answer = self.client.generate(request)
            except ServerUnreachableError as exc:
                self._wait_for_server(exc)
                continue
            except TransientServerError as exc:
                if self.stop.is_set():
                    raise _Stopping from None
                failures += 1
                if failures >= config.max_attempts:
                    raise _Exhausted(f"{config.max_attempts} tries failed; last: {exc}") from None
                self.metrics.retries.inc()
                delay = min(60.0, config.retry_backoff_s * 2 ** (failures - 1))
                log.warning("row %d turn %d: %s; retrying in %.1f s", row, turn, exc, delay)
                if self.stop.wait(delay):
                    raise _Stopping from None
                continue
            finally:
                self.metrics.inflight.dec()
                self.metrics.request_seconds.observe(time.monotonic() - started)
            self.metrics.server_up.set(1)
            self.metrics.turns.labels(answer.finish_reason).inc()
            self.metrics.generated_tokens.inc(len(answer.output_ids))
            self.metrics.prompt_tokens.inc(len(prompt))
            return answer

    def _record(self, row: int, raw: Any, prompter: Prompter, meta: dict[str, Any]) -> dict[str, Any]:
        """The journal record of one row (raises _Stopping when the run stops meanwhile)."""
        config = self.config
        base: dict[str, Any] = {"row": row, "id": raw.get("id") if isinstance(raw, dict) else None}
        try:
            result: Regenerated = regenerate_row(
                row, raw, prompter, lambda turn, ids: self._send(row, turn, ids, prompter), config.turns,
                config.reasoning, meta,
            )
        except BadRow as exc:
            return _bad_row_record(base, exc)
        except BadRequestError as exc:
            return {**base, "status": FAILED, "reason": SERVER_REFUSED, "message": f"row {row}: {exc}"}
        except _Exhausted as exc:
            return {**base, "status": FAILED, "reason": SERVER_ERROR, "message": f"row {row}: {exc}", "retryable": True}
        counts = {"turns": len(result.finish_reasons), "truncated_turns": result.finish_reasons.count("length"),
                  "generated_tokens": result.generated_tokens}
        if result.truncated and config.drop_truncated:
            message = f"row {row}: {counts['truncated_turns']} turn(s) cut at --max-new-tokens {config.max_new_tokens}"
            return {**base, **counts, "status": SKIPPED, "reason": TRUNCATED, "message": message}
        return {**base, **counts, "status": OK, "output": result.row}

    def _settle(self, journal: Journal, row: int, raw: Any, prompter: Prompter, meta: dict[str, Any], bar: Any) -> None:
        try:
            record = self._record(row, raw, prompter, meta)
            journal.append(record)
        except _Stopping:
            return
        except BaseException as exc:
            if self._fatal is None:
                self._fatal = exc
            self.request_stop("an error")
            return
        self.metrics.rows.labels(record["status"]).inc()
        if record["status"] != OK:
            self.metrics.errors.labels(record["reason"]).inc()
            log.info("row %d %s: %s", row, record["status"], record.get("message"))
        bar.update(1)

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> RegenSummary:
        started = time.monotonic()
        config = self.config
        summary = RegenSummary(str(config.output), str(config.journal_dir))
        check_metrics_port(config.metrics_host, config.metrics_port)  # before any work
        check_output(config)
        source = open_input(config.dataset, config.split)
        check_conversations(source)  # token rows or an empty file: refused before any request
        self.client = client = GenerateClient(config.server, config.request_timeout_s, config.concurrency + 8)
        if config.metrics_port:
            self.metrics.serve(config.metrics_port, config.metrics_host)
        rows = config.shard_rows(source.num_rows)
        self.metrics.planned.set(len(rows))
        self.metrics.run_started.set(time.time())
        self.metrics.running.set(1)
        try:
            client.server.wait_until_healthy(config.health_timeout_s, self.stop)
            self.metrics.server_up.set(1)
            info = client.model_info()
            model_path = str(info.get("model_path") or "")
            model_dir = self._model_dir(model_path)
            prompter, model = self._prompter(model_dir)
            fingerprint = info.get("model_fingerprint") or model_fingerprint(model_path or model_dir)
            sampling = {**config.sampling(), "stop_token_ids": prompter.stop_ids}
            identity = RegenIdentity(
                model_path=model_path or str(model_dir), model_fingerprint=fingerprint,
                tokenizer_fingerprint=model.fingerprint, chat_template_sha256=model.template_sha256, sampling=sampling,
                turns=config.turns, reasoning=config.reasoning, enable_thinking=config.enable_thinking,
                drop_truncated=config.drop_truncated, input_path=str(source.path.resolve()), input_split=source.split,
                input_fingerprint=source.fingerprint, input_rows=source.num_rows, shard_index=config.shard_index,
                num_shards=config.num_shards,
            )
            summary.model = identity.model_path
            journal = Journal.open(config.journal_dir, identity)
            try:
                done = read_summary(config.journal_dir)
                if done is not None and config.output.is_file():
                    summary.status, summary.counts = ALREADY_COMPLETE, dict(done.get("counts", {}))
                    summary.resumed = _done_before(journal, rows)
                    return summary
                self._probe(prompter)
                meta = {"model": identity.model_path, "model_fingerprint": fingerprint, "sampling": sampling,
                        "reasoning": config.reasoning}
                self._loop(journal, source, rows, prompter, meta, summary)
                if self._fatal is not None:
                    raise self._fatal
                summary.counts = tally(journal, rows)
                if self.stop.is_set():
                    summary.status, summary.stop_reason = INTERRUPTED, self.stop_reason
                elif summary.counts["pending"] or summary.counts["retryable"]:
                    summary.status = INCOMPLETE
                else:
                    write_output(config.output, journal, rows)
                    write_errors(journal, rows)
                    summary.status = COMPLETE
                    summary.seconds = time.monotonic() - started
                    write_summary(journal.directory, {"counts": summary.counts, "identity": identity.to_json(),
                                            "server": {**info, "url": config.server}, "output": str(config.output),
                                            "hsextract_version": __version__, "seconds": round(summary.seconds, 3)})
            finally:
                journal.close()
        except KeyboardInterrupt:
            summary.status, summary.stop_reason = INTERRUPTED, self.stop_reason or "interrupted: rerun to resume"
        finally:
            self.metrics.running.set(0)
            client.close()
        summary.seconds = time.monotonic() - started
        return summary

    def _loop(
        self, journal: Journal, source: Any, rows: range, prompter: Prompter, meta: dict[str, Any], summary: RegenSummary
    ) -> None:
        from tqdm import tqdm

        config = self.config
        summary.resumed = _done_before(journal, rows)
        self.metrics.rows.labels("resumed").inc(summary.resumed)
        shard = f" (shard {config.shard_index}/{config.num_shards})" if config.num_shards > 1 else ""
        log.info("regenerating %d conversations of %s%s with %s into %s%s", len(rows), source.path, shard,
                 meta["model"], config.output, f" ({summary.resumed} already done)" if summary.resumed else "")
        slots = threading.Semaphore(config.concurrency)
        with tqdm(total=len(rows), initial=summary.resumed, unit="row", desc="regenerate",
                  disable=not config.progress) as bar, ThreadPoolExecutor(config.concurrency, "hsextract-regen") as pool:
            for row, raw in source.iter_rows():
                if row not in rows or journal.done(row):
                    continue
                while not slots.acquire(timeout=0.5):
                    if self.stop.is_set():
                        break
                if self.stop.is_set():
                    break
                future = pool.submit(self._settle, journal, row, raw, prompter, meta, bar)
                future.add_done_callback(lambda _: slots.release())
