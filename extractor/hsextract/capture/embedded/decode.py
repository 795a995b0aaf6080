"""Continuous batching of generation requests (``/generate`` with ``max_new_tokens > 0``), as SGLang does.

One scheduler thread, apart from the extraction scheduler, repeats:

1. **admit** the oldest waiting requests (first come, first served) while the KV token budget
   (``max_total_tokens``) and ``max_running_requests`` allow, at most ``max_batch_tokens`` padded
   prompt tokens at a time, and **prefill** them in one right-padded forward (as extraction does:
   causal attention keeps real tokens from the pad, positions stay ``0..L-1``); each prompt's last
   state gives its first token;
2. they **join** the running batch (:class:`~hsextract.capture.embedded.kv_batch.KVBatch`: rows padded
   on the left, an attention mask, explicit per-row position ids);
3. one **decode step** of every running request: one batched forward of one token each, a token
   sampled per row (:mod:`~hsextract.capture.embedded.sampling`); finished requests (a stop token,
   or ``max_new_tokens``) are answered and **leave** the batch.

So new requests join between decode steps and finished ones leave, and a step never waits for the
slowest request of a batch. The budget counts the padded cache's token slots at their worst:
``rows * max(prompt + max_new_tokens)`` over the running rows; a request waits until its row fits, and
none fails for memory (a request alone always fits: its ``max_new_tokens`` is capped to the budget, as
SGLang caps it; a prompt that alone exceeds the budget is refused). A prompt of the model's context
(``max_position_embeddings``) or more, or with ``max_new_tokens`` past it, is refused with its rid
(SGLang's two checks in ``TokenizerManager._validate_one_request``).

Generation requests are never dumped, whatever their rid: SGLang's hook would dump the extend pass of
a rid with the extraction prefix, so regeneration sends rids of its own.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.embedded.inbox import drain_inbox
from hsextract.capture.embedded.kv_batch import KVBatch, check_layers
from hsextract.capture.embedded.padded_batch import PaddedBatch
from hsextract.capture.embedded.sampling import make_generator, next_tokens
from hsextract.capture.embedded.static_kv import StaticKV, slots
from hsextract.capture.embedded.step_graphs import StepGraphs
from hsextract.contract.generate import FinishReason, GenerationAnswer, GenerationRequest, SamplingParams
from hsextract.errors import BadRequestError

log = logging.getLogger(__name__)

#: the ``phase`` label values of ``hsextract_server_decode_seconds``: one prefill forward of newly admitted
#: requests (their first token included), and one batched decode step; each ends on reading its tokens back,
#: so on a GPU the seconds are the device's as well as the host's
DECODE_PHASES = ("prefill", "step")
#: seconds with no generation request running or waiting before the static buffers (and the step's graph) are freed
IDLE_RELEASE_S = 2.0


@dataclass(eq=False)
class Decoding:
    """One generation request from arrival to answer."""

    request: GenerationRequest
    sampling: SamplingParams  # max_new_tokens capped to the budget
    stops: frozenset[int]
    generator: torch.Generator | None
    future: Future[GenerationAnswer] = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    output: list[int] = field(default_factory=list)

    @property
    def reserve(self) -> int:
        """KV slots this request holds at its longest."""
        return len(self.request.input_ids) + self.sampling.max_new_tokens

    def add(self, token: int) -> FinishReason | None:
        """Append a generated token; the finish reason once it is the last (SGLang's order: stop before length)."""
        self.output.append(token)
        if token in self.stops:
            return FinishReason("stop", matched=token)
        if len(self.output) >= self.sampling.max_new_tokens:
            return FinishReason("length", length=self.sampling.max_new_tokens)
        return None


def eos_ids(model: Any) -> frozenset[int]:
    """The model's end ids, config.json and generation_config.json together (SGLang's ``_get_hf_eos_token_id``)."""
    found: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(v for v in value if isinstance(v, int))
    return frozenset(found)


class DecodeScheduler:
    """Owns the generation queue, the running batch and its thread; shares the engine's model."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        config: ServeConfig,
        max_batch_tokens: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.model = model
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        self.device = device
        self.max_total_tokens = config.max_total_tokens
        self.max_running_requests = config.max_running_requests
        self.max_batch_tokens = max_batch_tokens
        self.context_length = int(getattr(self.config, "max_position_embeddings", 0) or 0)
        self.vocab_size = int(self.config.vocab_size)
        self.eos_ids = eos_ids(model)
        # transformers 5.x renames the cache argument (past_key_values -> cache) model by model
        self._cache_kwarg = "cache" if "cache" in inspect.signature(self.base.forward).parameters else "past_key_values"
        self.unsupported: str | None = None
        if getattr(self.config, "final_logit_softcapping", None):
            self.unsupported = "this model soft-caps its logits, which the embedded decode does not apply"
        self._inbox: queue.Queue[Decoding | None] = queue.Queue()
        self._waiting: deque[Decoding] = deque()
        self._running: list[Decoding] = []
        self._batch = KVBatch()
        # "static": fixed buffers a step writes into (capture/embedded/static_kv.py), the layout a graph can replay
        self.static = config.decode_kv == "static"
        self._static = StaticKV(config.max_total_tokens)
        self._idle_since: float | None = None  # since when nothing ran or waited (see IDLE_RELEASE_S)
        # its step as a CUDA graph (capture/embedded/step_graphs.py): static layout on a GPU only
        self.graphs = StepGraphs(device) if config.decode_graphs and self.static and device.type == "cuda" else None
        self._stop = threading.Event()
        r = registry if registry is not None else CollectorRegistry()
        self.generated = Counter("hsextract_server_generated_tokens", "Tokens generated (decode)", registry=r)
        self.steps = Counter("hsextract_server_decode_steps", "Batched decode steps run", registry=r)
        self.running_gauge = Gauge("hsextract_server_decode_running", "Requests in the decode batch", registry=r)
        self.waiting_gauge = Gauge("hsextract_server_decode_waiting", "Generation requests waiting for KV room", registry=r)
        self.kv_gauge = Gauge(
            "hsextract_server_decode_kv_slots",
            "Token slots the decode KV cache holds (padding included; the static buffers until idle 2 s)",
            registry=r,
        )
        self.phase_seconds = Histogram(
            "hsextract_server_decode_seconds",
            "Seconds of one decode-scheduler forward: prefill (admitted requests) or step (every running request)",
            ["phase"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        for phase in DECODE_PHASES:
            self.phase_seconds.labels(phase)
        self._thread = threading.Thread(target=self._loop, name="hsextract-decode", daemon=True)
        self._thread.start()

    # -- API (any thread) ---------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[GenerationAnswer]]:
        """Queue the requests (all or none): :class:`BadRequestError` naming the rid of one that cannot run."""
        if self.unsupported is not None:
            raise BadRequestError("decode_unsupported", f"request {requests[0].rid}: {self.unsupported}")
        queued = [self._checked(r) for r in requests]
        for item in queued:
            self._inbox.put(item)
        return [item.future for item in queued]

    def _checked(self, request: GenerationRequest) -> Decoding:
        prompt, params = len(request.input_ids), request.sampling
        if self.context_length and prompt >= self.context_length:
            raise BadRequestError(
                "prompt_too_long",
                f"request {request.rid}: the input ({prompt} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)",
            )
        if self.context_length and prompt + params.max_new_tokens > self.context_length:
            raise BadRequestError(
                "prompt_too_long",
                f"request {request.rid}: {prompt} input tokens + {params.max_new_tokens} max_new_tokens exceed the model's "
                f"context length ({self.context_length} tokens); lower max_new_tokens",
            )
        if prompt >= self.max_total_tokens:
            raise BadRequestError(
                "prompt_too_long",
                f"request {request.rid}: the input ({prompt} tokens) exceeds the KV budget of {self.max_total_tokens} tokens "
                "(--max-total-tokens)",
            )
        room = self.max_total_tokens - prompt
        if params.max_new_tokens > room:  # SGLang caps max_new_tokens to the memory budget too
            params = dataclasses.replace(params, max_new_tokens=room)
        stops = frozenset() if params.ignore_eos else frozenset(params.stop_token_ids) | self.eos_ids
        return Decoding(request, params, stops, make_generator(params, self.device))

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join()
        error = RuntimeError("server shutting down")
        for item in [*self._running, *self._waiting]:
            if not item.future.done():
                item.future.set_exception(error)

    def on_own_thread(self) -> bool:
        """Whether the caller is the decode thread (its forwards are no extraction's)."""
        return threading.current_thread() is self._thread

    # -- scheduler thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not (self._running or self._waiting))
            if self._stop.is_set():
                break
            self._release_when_idle()
            admitted, planned = self._admit()
            try:
                with torch.inference_mode():
                    if admitted:
                        with self.phase_seconds.labels("prefill").time():
                            self._prefill(admitted, planned)
                    if self._running:
                        with self.phase_seconds.labels("step").time():
                            self._step()
            except Exception as exc:  # a failed forward fails its requests, not the server
                log.exception("decode forward failed")
                for item in [*admitted, *self._running]:
                    if not item.future.done():
                        item.future.set_exception(exc)
                self._running, self._batch, self._static = [], KVBatch(), StaticKV(self.max_total_tokens)
            self.running_gauge.set(len(self._running))
            self.waiting_gauge.set(len(self._waiting))
            rows, columns = self._static.capacity if self.static else (self._batch.rows, self._batch.columns)
            self.kv_gauge.set(rows * columns)

    def _drain(self, block: bool) -> None:
        drain_inbox(self._inbox, self._waiting, self._stop, block)

    def cost(self, rows: Sequence[Decoding]) -> int:
        """Worst-case padded KV slots of these rows decoding together."""
        longest = max((r.reserve for r in rows), default=0)
        return slots(len(rows), longest) if self.static else len(rows) * longest

    def _release_when_idle(self) -> None:
        """Free the static buffers (and the step's graph) once no request has run for :data:`IDLE_RELEASE_S`: kept
        between requests, they and the graph serve the next ones without reallocating or capturing again."""
        if self._running or self._waiting:
            self._idle_since = None
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= IDLE_RELEASE_S and self._static.capacity != (0, 0):
            self._static.release()
            if self.graphs is not None:
                self.graphs.drop()

    def _admit(self) -> tuple[list[Decoding], list[Decoding]]:
        """The oldest waiting requests that fit beside the running ones, in order, for one prefill forward; and
        all those that fit (the static buffers are sized for them, so a burst is allocated once)."""
        fitting: list[Decoding] = []
        for item in self._waiting:
            if len(self._running) + len(fitting) >= self.max_running_requests:
                break
            alone = not self._running and not fitting  # a request alone always runs (its rounded buffer may pass the budget)
            if not alone and self.cost([*self._running, *fitting, item]) > self.max_total_tokens:
                break  # first come, first served: a later small request does not overtake
            fitting.append(item)
        taken: list[Decoding] = []
        longest = 0
        for item in fitting:  # one right-padded prefill of at most max_batch_tokens slots (the oldest always)
            longest = max(longest, len(item.request.input_ids))
            if taken and longest * (len(taken) + 1) > self.max_batch_tokens:
                break
            taken.append(item)
        for _ in taken:
            self._waiting.popleft()
        return taken, fitting

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()  # transformers' generate reads float32 logits too

    def _prefill(self, items: list[Decoding], planned: list[Decoding]) -> None:
        import transformers

        padded = PaddedBatch.of([item.request.input_ids for item in items])  # no torch intra-op threads (padded_batch.py)
        ids, lengths = padded.ids, padded.lengths
        cache: Any = transformers.DynamicCache(config=self.config)
        check_layers(cache)
        out = self.base(input_ids=ids.to(self.device), use_cache=True, **{self._cache_kwarg: cache})
        last = torch.tensor([n - 1 for n in lengths], device=self.device)
        hidden = out.last_hidden_state[torch.arange(len(items), device=self.device), last]
        tokens = next_tokens(self._logits(hidden), [i.sampling for i in items], [i.generator for i in items]).tolist()
        joining: list[int] = []
        for row, (item, token) in enumerate(zip(items, tokens, strict=True)):
            if not self._advance(item, token):
                joining.append(row)
        if not joining:
            return
        if self.static:  # sized for every admitted request, this prefill's and the next ones'
            longest = max(r.reserve for r in [*self._running, *planned])
            rows = len(self._running) + len(planned) - (len(items) - len(joining))
            self._static.join(cache, joining, [lengths[row] for row in joining], longest, planned=rows)
            self._running.extend(items[row] for row in joining)
            return
        if len(joining) != len(items):
            index = torch.tensor(joining, dtype=torch.int64, device=self.device)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self._batch.join(cache, [lengths[row] for row in joining])
        self._running.extend(items[row] for row in joining)

    def _step(self) -> None:
        rows = self._running
        if self.static:
            hidden = self._static_step(rows)
        else:  # the new token's position is its index in its own sequence, whatever padding its row has
            ids = torch.tensor([[r.output[-1]] for r in rows], dtype=torch.int64, device=self.device)
            positions = torch.tensor([[len(r.request.input_ids) + len(r.output) - 1] for r in rows], device=self.device)
            hidden = self._forward_last(ids, self._batch.step_mask(), positions, self._batch.cache)
        tokens = next_tokens(self._logits(hidden), [r.sampling for r in rows], [r.generator for r in rows])
        self.steps.inc()
        keep = [i for i, (row, token) in enumerate(zip(rows, tokens.tolist(), strict=True)) if not self._advance(row, token)]
        if len(keep) != len(rows):
            (self._static if self.static else self._batch).keep(keep)
            self._running = [rows[i] for i in keep]

    def _forward_last(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """One decode forward of a token a row: the rows' final states ``[rows, hidden]``."""
        out = self.base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache})
        hidden: torch.Tensor = out.last_hidden_state[:, -1]
        return hidden

    def _static_step(self, rows: list[Decoding]) -> torch.Tensor:
        """The step on the static layout (a row's position is its column): replayed as a CUDA graph when
        decode graphs are on, else eagerly on the running rows alone."""
        kv, dtype = self._static, self.model.dtype
        kv.load([r.output[-1] for r in rows])
        hidden = None
        if self.graphs is not None:
            replayed = self.graphs.run(kv, lambda count: kv.step(self._forward_last, count, dtype))
            hidden = None if replayed is None else replayed[: len(rows)]
        if hidden is None:
            hidden = kv.step(self._forward_last, len(rows), dtype)
        kv.advance()
        return hidden

    def _advance(self, item: Decoding, token: int) -> bool:
        """Add ``token`` to ``item``; True (and answered) when that finished it."""
        self.generated.inc()
        finish = item.add(token)
        if finish is None:
            return False
        answer = GenerationAnswer(
            item.request.rid, list(item.output), finish, len(item.request.input_ids), time.monotonic() - item.arrived
        )
        item.future.set_result(answer)
        return True
