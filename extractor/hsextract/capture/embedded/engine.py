"""Run a transformers model the way SGLang's scheduler feeds extend passes to its hook.

Requests queue up; each scheduler step runs either one batched forward of whole short prompts
(right-padded, up to a token budget, chosen by :func:`pick_batch`: length-sorted around the oldest
waiting prompt) or the next chunk of a long prompt on its KV cache, exactly as chunked prefill
arrives in SGLang. Every step's rows go to the shared :class:`DumpSink` through the shared
:class:`HostCopier`.

On a GPU the scheduler thread never waits for the device as a whole: it gathers a batch's rows on
the device, queues their copy into a pinned buffer on a side stream, hands the batch to the sink
and launches the next forward, which overlaps the previous copy and the dump writes. It keeps at
most two forwards queued on the device (it waits for the older one's own event), so the next batch
is formed from the freshest queue. A request is answered once its dump is written.

A request that asks for FP8 storage (``hsextract_storage``) has its rows stacked ``[aux..., final]``
(the pre-norm final when it asked for it) and quantized per token on the device (``contract.fp8``),
so only FP8 bytes and scales are copied to the host. One forward can mix FP8 and model-dtype
requests: each kind's rows are gathered apart and travel in the same batch to the sink.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hsextract import __version__
from hsextract.capture.dump_sink import DumpSink, ExtendBatch, Fp8Rows, Segment
from hsextract.capture.embedded.batching import pick_batch
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.embedded.decode import DecodeScheduler
from hsextract.capture.embedded.forward_graphs import ForwardGraphs, bucket, non_embedding_parameters, use_graphs
from hsextract.capture.embedded.inbox import drain_inbox
from hsextract.capture.embedded.kv_batch import throwaway_cache
from hsextract.capture.embedded.padded_batch import PaddedBatch
from hsextract.capture.embedded.request import EngineRequest
from hsextract.capture.embedded.unbatched import CheckThread, answer_alone, move_spot_checks, recorded_event
from hsextract.capture.pinned import HostCopier
from hsextract.capture.stages import StageClock
from hsextract.contract.files.dump_dir import prepare_dump_root
from hsextract.contract.files.dumps import DumpSource
from hsextract.contract.files.fp8 import quantize_per_token
from hsextract.contract.generate import GenerateAnswer, GenerationAnswer, GenerationRequest
from hsextract.contract.layers import capture_indices, resolve_aux_layer_ids
from hsextract.contract.model_config import check_model_dir
from hsextract.contract.model_fingerprint import model_fingerprint
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.spot_check import SpotCheckAnswer
from hsextract.contract.states import ErrorReason
from hsextract.errors import ConfigError, DumpError

log = logging.getLogger(__name__)

ENGINE_NAME = "hsextract-embedded"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FORWARDS_IN_FLIGHT = 2  # forwards queued on the device before the scheduler waits for the older one


@dataclass
class _Rows:
    """One forward's rows, gathered on the device in batch order."""

    segments: list[Segment]
    input_ids: torch.Tensor  # [n] on the host
    aux: torch.Tensor  # [n, K, H]
    final: torch.Tensor  # [n, H]
    prenorm: torch.Tensor | None  # [n, H]
    fp8: Fp8Rows | None = None  # the rows of the FP8 requests (their segments count rows there)


class Engine:
    """Owns the model, the scheduler thread and the dump sink."""

    def __init__(self, config: ServeConfig, dump: bool = True, clock: StageClock | None = None) -> None:
        import transformers

        self.model_path = Path(config.model).resolve()  # recorded in dumps and outputs: never relative
        check_model_dir(self.model_path, "--model")
        if dump:
            prepare_dump_root(Path(config.dump_dir))  # refuse an unsafe dump root before loading the model
        self.model_fingerprint = model_fingerprint(self.model_path)
        device, dtype = config.device, config.dtype
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device cuda asked for but torch sees no GPU; use --device cpu")
        # PyTorch's cuDNN attention builds an execution plan per new shape and per thread: every decode step
        # (one column longer than the last, a batch that changed) paid a build on the decode thread. A process-wide
        # switch (the flag is global): flash and memory-efficient attention take its place.
        torch.backends.cuda.enable_cudnn_sdp(config.cudnn_attention)
        kwargs: dict[str, Any] = {} if dtype == "auto" else {"dtype": _DTYPES[dtype]}
        model = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs)
        # transformers types Module.to through a decorator that mypy misreads
        self.model = model.to(device).eval()  # type: ignore[arg-type]
        self.base = self.model.base_model  # the decoder stack without lm_head: no logits needed
        self.config = self.model.config
        self.num_layers = int(self.config.num_hidden_layers)
        self.hidden_size = int(self.config.hidden_size)
        self.vocab_size = int(self.config.vocab_size)
        self.dtype = self.model.dtype
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        # spot checks' own stream (unbatched.answer_alone says why)
        self._check_stream = torch.cuda.Stream(self.device) if self.cuda else None  # type: ignore[no-untyped-call]
        self.aux_layer_ids = resolve_aux_layer_ids(config.layer_ids, self.num_layers)
        self.capture = capture_indices(self.aux_layer_ids)
        self.chunk_size = config.chunked_prefill_size if config.chunked_prefill_size > 0 else None
        self.max_batch_tokens = config.max_batch_tokens
        self.batch_window = config.batch_window
        self.rid_prefix = config.rid_prefix
        self.dump_dir = Path(config.dump_dir)
        self.clock = clock if clock is not None else StageClock()
        params = inspect.signature(self.base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # The last layer's output before the final norm (the input of the norm module), per thread: the scheduler's
        # forwards and the spot checks' run at the same time.
        self._prenorms = threading.local()
        self.base.norm.register_forward_hook(self._grab_prenorm)
        # small models: the batched forward as CUDA graphs (forward_graphs.py says when and why)
        self.cuda_graphs = config.cuda_graphs
        self.graphs: ForwardGraphs | None = None
        if use_graphs(config.cuda_graphs, self.cuda, non_embedding_parameters(self.base)):
            self.graphs = ForwardGraphs(self._eager_forward, [*self.capture, -1], self.device)
        self.sink: DumpSink | None = None
        if dump:
            self.sink = DumpSink(
                self.dump_dir,
                self._dump_source(),
                rid_prefix=self.rid_prefix,
                queue_size=config.dump_queue_size,
                writers=config.dump_writers,
                clock=self.clock,
            )
        self.copier = HostCopier(slots=max(2, config.dump_queue_size // 2), pin=self.cuda, clock=self.clock)
        if self.cuda and dump:
            largest = max(self.max_batch_tokens, self.chunk_size or 0)
            self.copier.pool.reserve(largest, len(self.capture) + 1, self.hidden_size, self.dtype)  # + pre-norm: _gather
        self._inbox: queue.Queue[EngineRequest | None] = queue.Queue()
        self._waiting: deque[EngineRequest] = deque()
        self._chunking: deque[EngineRequest] = deque()
        self._alone: deque[EngineRequest] = deque()  # spot checks: one unbatched forward each
        self._checks = CheckThread()
        self._in_flight: deque[Any] = deque()  # end events of forwards queued on the device
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hsextract-scheduler", daemon=True)
        self._thread.start()
        # generation (max_new_tokens > 0): its own scheduler thread on the same model (capture/embedded/decode.py)
        self.decoder = DecodeScheduler(self.model, self.device, config, self.max_batch_tokens, registry=self.clock.registry)

    def _grab_prenorm(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        decoder = getattr(self, "decoder", None)  # None while the engine is still being built
        if decoder is None or not decoder.on_own_thread():  # the decode thread's forwards are not extraction's
            self._prenorms.state = args[0]

    def _take_prenorm(self) -> torch.Tensor | None:
        """The pre-norm state of the calling thread's last forward, once (None if its hook did not run)."""
        prenorm: torch.Tensor | None = getattr(self._prenorms, "state", None)
        self._prenorms.state = None
        return prenorm

    def _dump_source(self) -> DumpSource:
        return DumpSource(
            engine=ENGINE_NAME,
            engine_version=__version__,
            model_path=str(self.model_path),
            model_fingerprint=self.model_fingerprint,
            layer_ids=self.aux_layer_ids,
            capture_indices=self.capture,
            final_layer_id=self.num_layers - 1,
            final_norm_applied=True,
            provides_final_prenorm=True,
        )

    def info(self) -> ServerInfo:
        return ServerInfo(
            model_path=str(self.model_path),
            model_fingerprint=self.model_fingerprint,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            dtype=str(self.dtype).removeprefix("torch."),
            layer_ids=self.aux_layer_ids,
            dump_dir=str(self.dump_dir),
            engine=ENGINE_NAME,
            provides_final_prenorm=True,
            engine_version=__version__,
            rid_prefix=self.rid_prefix,
            final_prenorm_per_request=True,
            fp8_per_request=True,
        )

    def info_json(self) -> dict[str, Any]:
        """``/server_info``: :class:`ServerInfo` plus what helps a person reading it."""
        return {
            **self.info().to_json(),
            "architecture": self.architecture,
            "model_type": self.config.model_type,
            "device": str(self.device),
            "capture_indices": self.capture,
            "final_norm_applied": True,
            "chunked_prefill_size": self.chunk_size or -1,
            "max_batch_tokens": self.max_batch_tokens,
            "batch_window": self.batch_window,
            "disable_radix_cache": True,
            "max_total_tokens": self.decoder.max_total_tokens,
            "max_running_requests": self.decoder.max_running_requests,
            "context_length": self.decoder.context_length,
            "cuda_graphs": {
                "setting": self.cuda_graphs,
                "in_use": self.graphs is not None and self.graphs.enabled,
                "captured": 0 if self.graphs is None else self.graphs.captured,
            },
        }

    @property
    def architecture(self) -> str:
        return str((self.config.architectures or [type(self.model).__name__])[0])

    # -- API --------------------------------------------------------------------------------------
    def submit(
        self, rid: str, input_ids: list[int], final_prenorm: bool = False, storage: str | None = None
    ) -> Future[dict[str, Any]]:
        """Queue one prompt; the future resolves once its forward ran and its dump (if any) is written."""
        return self._queue(EngineRequest(rid=rid, input_ids=input_ids, final_prenorm=final_prenorm, storage=storage))

    def spot_check(self, rid: str, input_ids: list[int]) -> Future[Any]:
        """Queue one prompt for a forward of its own, never dumped: a SpotCheckAnswer (:mod:`.unbatched`)."""
        return self._queue(EngineRequest(rid=rid, input_ids=input_ids, spot_check=True))

    def _queue(self, request: EngineRequest) -> Future[Any]:
        self._inbox.put(request)
        return request.future

    def generate(self, requests: list[GenerationRequest]) -> list[Future[GenerationAnswer]]:
        """Queue prompts to decode from (never dumped); BadRequestError names a rid that cannot run."""
        return self.decoder.submit(requests)

    def shutdown(self) -> None:
        self.decoder.shutdown()
        self._stop.set()
        self._inbox.put(None)
        self._thread.join()
        self._checks.close()
        if self.sink is not None:
            self.sink.flush()
            self.sink.close()

    # -- scheduler ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        idle_since: float | None = None  # when the scheduler last ran out of work
        while not self._stop.is_set():
            has_work = bool(self._waiting or self._chunking or self._alone)
            if not has_work and idle_since is None:
                idle_since = time.perf_counter()
            self._drain_inbox(block=not has_work)
            if self._stop.is_set():
                break
            if idle_since is not None and (self._waiting or self._alone):
                self.clock.observe("idle", time.perf_counter() - idle_since)
                idle_since = None
            try:
                self._step()
            except Exception:  # a failed forward fails its requests, not the server
                log.exception("forward failed")

    def _drain_inbox(self, block: bool) -> None:
        drain_inbox(self._inbox, self._waiting, self._stop, block)
        self._waiting = move_spot_checks(self._waiting, self._alone)

    def _step(self) -> None:
        # Alternate: a long prompt's next chunk, then a batch of short prompts, so neither starves; the spot
        # checks go to their own thread, which launches each alone on its own stream beside the forwards.
        if self._chunking:
            self._wait_for_room()
            request = self._chunking.popleft()
            self._run_guarded([request], self._forward_chunk)
        self._wait_for_room()
        self._drain_inbox(block=False)  # what arrived while the device was busy joins this choice
        batch = self._take_batch()
        if batch:
            self._run_guarded(batch, self._forward_batch)
        while self._alone:
            self._checks.submit(self._alone.popleft(), self._forward_alone)

    def _wait_for_room(self) -> None:
        """Keep at most FORWARDS_IN_FLIGHT forwards queued: wait for the oldest one's own end (``wait_device``)."""
        while len(self._in_flight) >= FORWARDS_IN_FLIGHT:
            started = time.perf_counter()
            self._in_flight.popleft().synchronize()
            self.clock.observe("wait_device", time.perf_counter() - started)

    def _take_batch(self) -> list[EngineRequest]:
        if self.chunk_size is not None:
            long = [r for r in self._waiting if len(r.input_ids) > self.chunk_size]
            if long:
                self._chunking.extend(long)
                self._waiting = deque(r for r in self._waiting if len(r.input_ids) <= self.chunk_size)
        window = [self._waiting[i] for i in range(min(self.batch_window, len(self._waiting)))]
        chosen = pick_batch([len(r.input_ids) for r in window], self.max_batch_tokens)
        taken = set(chosen)
        for _ in window:
            self._waiting.popleft()
        self._waiting.extendleft(reversed([r for i, r in enumerate(window) if i not in taken]))
        return [window[i] for i in chosen]

    def _run_guarded(self, requests: list[EngineRequest], run: Callable[[list[EngineRequest]], None]) -> None:
        try:
            run(requests)
        except Exception as exc:
            log.exception("forward of %s failed", [r.rid for r in requests])
            for request in requests:
                request.cache = None
                if request in self._chunking:
                    self._chunking.remove(request)
                if not request.future.done():
                    request.future.set_exception(exc)

    def _eager_forward(self, ids: torch.Tensor) -> tuple[Sequence[torch.Tensor], torch.Tensor | None]:
        """The batched forward of padded ``ids`` on the device: transformers' hidden states and the pre-norm state."""
        out = self.base(input_ids=ids, output_hidden_states=True, **{self._cache_kwarg: throwaway_cache(self.config)})
        return out.hidden_states, self._take_prenorm()

    @torch.inference_mode()
    def _forward_batch(self, requests: list[EngineRequest]) -> None:
        lengths = [len(r.input_ids) for r in requests]
        graphed = self.graphs is not None and self.graphs.enabled
        shape = bucket(len(requests), max(lengths), self.max_batch_tokens) if graphed else None
        batch = PaddedBatch.of([r.input_ids for r in requests], shape, pin=self.cuda)
        ids = batch.ids
        now = time.monotonic()
        for request in requests:
            self.clock.observe("queue", now - request.arrived)
        self.clock.tokens.inc(sum(lengths))
        self.clock.padded_tokens.inc(batch.slots)
        began, started = self._mark()
        replayed = self.graphs.run(ids) if shape is not None and self.graphs is not None else None
        states: Sequence[torch.Tensor]
        if replayed is not None:
            states, prenorm = replayed  # a graph's own outputs: gathered below, before its next replay
        else:
            states, prenorm = self._eager_forward(ids.to(self.device, non_blocking=True))
        self.clock.observe("launch", time.perf_counter() - began)
        plain = [i for i, r in enumerate(requests) if r.storage is None]
        fp8 = [i for i, r in enumerate(requests) if r.storage is not None]
        segments: list[Segment] = []
        for members in (plain, fp8):
            row = 0
            for i in members:
                request = requests[i]
                segments.append(Segment(request.rid, 0, row, lengths[i], request.final_prenorm, request.storage, stacked=True))
                row += lengths[i]
        own = replayed is None  # a graph's outputs are overwritten by its next replay: rows are copied out of them
        if plain:
            rows, flat_ids = batch.picker(plain, self.device, own)
            gathered = self._gather(rows, states, prenorm, any(requests[i].final_prenorm for i in plain))
        else:
            flat_ids, gathered = ids.new_empty(0), self._no_rows(states[-1])
        fp8_rows = None
        if fp8:
            rows, fp8_ids = batch.picker(fp8, self.device, own)
            slots = [requests[i].final_prenorm for i in fp8 for _ in range(lengths[i])]
            fp8_rows = self._gather_fp8(rows, fp8_ids, states, prenorm, slots)
        self._emit(_Rows(segments, flat_ids, *gathered, fp8=fp8_rows), requests, began, started)

    @torch.inference_mode()
    def _forward_chunk(self, requests: list[EngineRequest]) -> None:
        import transformers

        (request,) = requests
        assert self.chunk_size is not None
        start = request.done_tokens
        end = min(len(request.input_ids), start + self.chunk_size)
        if request.cache is None:
            request.cache = transformers.DynamicCache(config=self.config)
            self.clock.observe("queue", time.monotonic() - request.arrived)
        ids = torch.tensor(request.input_ids[start:end], dtype=torch.int64)
        if self.cuda:
            ids = ids.pin_memory()
        n = end - start
        self.clock.tokens.inc(n)
        self.clock.padded_tokens.inc(n)
        began, started = self._mark()
        out = self.base(
            input_ids=ids.unsqueeze(0).to(self.device, non_blocking=True),
            output_hidden_states=True,
            use_cache=True,
            **{self._cache_kwarg: request.cache},
        )
        states, prenorm = out.hidden_states, self._take_prenorm()
        segment = Segment(request.rid, start, 0, n, request.final_prenorm, request.storage, stacked=True)
        fp8_rows = None
        if request.storage is None:
            gathered = self._gather(lambda t: t.reshape(n, -1), states, prenorm, request.final_prenorm)
        else:
            gathered = self._no_rows(states[-1])
            fp8_rows = self._gather_fp8(lambda t: t.reshape(n, -1), ids, states, prenorm, [request.final_prenorm] * n)
        request.done_tokens = end
        last = end >= len(request.input_ids)
        if last:
            request.cache = None
        else:
            self._chunking.append(request)
        plain_ids = ids if fp8_rows is None else ids.new_empty(0)
        self._emit(_Rows([segment], plain_ids, *gathered, fp8=fp8_rows), requests if last else [], began, started)

    def _forward_alone(self, request: EngineRequest) -> SpotCheckAnswer:
        """A spot check's answer, on the check thread: the row alone in one forward (``unbatched.answer_alone``)."""
        self._take_prenorm()  # set again during this forward by _grab_prenorm, on this thread
        cache = {self._cache_kwarg: throwaway_cache(self.config)}  # empty: its tensors come on the check's stream
        return answer_alone(
            self.base, request, self.device, self.capture, cache, self._take_prenorm, self._check_stream, self.clock
        )

    def _gather(
        self, rows: Callable[[torch.Tensor], torch.Tensor], states: Sequence[torch.Tensor], prenorm: Any, with_prenorm: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """aux ``[n, K, H]`` and final ``[n, H]``; with the pre-norm state, aux and it are the slot ranges of one ``[n, K+1,
        H]`` tensor, copied to the host in one piece, from which a stacked dump is written as it is (``tiled``)."""
        final = rows(states[-1])
        if with_prenorm and prenorm is None:
            raise RuntimeError("the pre-norm hook on the model's final norm did not run")
        stacked = torch.stack([*(rows(states[c]) for c in self.capture), *([rows(prenorm)] if with_prenorm else [])], dim=1)
        return (stacked[:, :-1], final, stacked[:, -1]) if with_prenorm else (stacked, final, None)

    def _gather_fp8(
        self,
        rows: Callable[[torch.Tensor], torch.Tensor],
        input_ids: torch.Tensor,
        states: Sequence[torch.Tensor],
        prenorm: Any,
        prenorm_slot: list[bool],
    ) -> Fp8Rows:
        """``[aux..., final]`` stacked ``[m, K+1, H]`` on the device and quantized per token there; the
        last slot of row ``r`` is the pre-norm final state when ``prenorm_slot[r]``, else the post-norm one."""
        final = rows(states[-1])
        if any(prenorm_slot):
            if prenorm is None:
                raise RuntimeError("the pre-norm hook on the model's final norm did not run")
            before = rows(prenorm)
            if all(prenorm_slot):
                final = before
            else:
                mask = torch.tensor(prenorm_slot, dtype=torch.bool, pin_memory=self.cuda).to(self.device, non_blocking=True)
                final = torch.where(mask.unsqueeze(1), before, final)
        hidden, scales = quantize_per_token(torch.stack([*(rows(states[c]) for c in self.capture), final], dim=1))
        return Fp8Rows(input_ids, hidden, scales, str(self.dtype).removeprefix("torch."))

    def _no_rows(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Empty model-dtype rows, for a forward whose requests are all FP8."""
        width = int(like.shape[-1])
        return like.new_empty((0, len(self.capture), width)), like.new_empty((0, width)), None

    def _mark(self) -> tuple[float, Any]:
        """Host time now and, on a GPU, an event recorded on the current stream."""
        event = recorded_event(self.cuda)
        return time.perf_counter(), event

    def _emit(self, rows: _Rows, answer: list[EngineRequest], began: float, started: Any) -> None:
        """Hand a forward's rows to the sink; ``answer`` are resolved once its dumps are written."""
        self.clock.batches.inc()
        spans: list[tuple[str, Any, Any]] = []
        ended: Any = None
        if self.cuda:
            ended = recorded_event(True)
            spans.append(("forward", started, ended))
            self._in_flight.append(ended)
        else:
            self.clock.observe("forward", time.perf_counter() - began)

        def complete(failed: dict[str, str]) -> None:  # a failed dump's error marker may be missing too (disk full)
            for request in (r for r in answer if not r.future.done()):
                if request.rid in failed:
                    error = DumpError(ErrorReason.SERVER_DUMP_ERROR, f"dump {request.rid}: {failed[request.rid]}")
                    request.future.set_exception(error)
                else:
                    prefilled = GenerateAnswer.for_prefill(request.rid, len(request.input_ids), request.arrived)
                    request.future.set_result(prefilled.to_json())

        wanted = self.sink is not None and any(self.sink.wants(s.rid) for s in rows.segments)
        if self.sink is None or not wanted:
            if ended is not None:
                ended.synchronize()  # nothing to copy: answer once the forward is done
                for stage, start, end in spans:
                    self.clock.observe(stage, float(start.elapsed_time(end)) / 1e3)
            complete({})
            return
        batch: ExtendBatch = self.copier.copy(
            rows.segments, rows.input_ids, rows.final, rows.aux, rows.prenorm, private=True, spans=spans, fp8=rows.fp8
        )
        batch.on_complete = lambda: complete(batch.failed)
        self.sink.submit(batch)
