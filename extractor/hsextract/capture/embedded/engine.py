"""Run a transformers model the way SGLang's scheduler feeds extend passes to its hook.

Requests queue up; each scheduler step runs either one batched forward of whole short prompts
(right-padded, up to a token budget) or the next chunk of a long prompt on its KV cache, exactly
as chunked prefill arrives in SGLang. Every step's rows go to the shared :class:`DumpSink`.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract import __version__
from hsextract.capture.dump_sink import DumpSink, ExtendBatch, Segment
from hsextract.config import ServeConfig
from hsextract.contract.dumps import DumpSource
from hsextract.contract.layers import capture_indices, resolve_aux_layer_ids
from hsextract.contract.server_info import ServerInfo
from hsextract.errors import ConfigError

log = logging.getLogger(__name__)

ENGINE_NAME = "hsextract-embedded"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class EngineRequest:
    rid: str
    input_ids: list[int]
    future: Future[dict[str, Any]] = field(default_factory=Future)
    done_tokens: int = 0
    cache: Any = None
    arrived: float = field(default_factory=time.monotonic)


class Engine:
    """Owns the model, the scheduler thread and the dump sink."""

    def __init__(self, config: ServeConfig, dump: bool = True) -> None:
        import transformers

        self.model_path = Path(config.model)
        if not (self.model_path / "config.json").exists():
            raise ConfigError(f"model {self.model_path} has no config.json; pass a save_pretrained directory")
        device, dtype = config.device, config.dtype
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device cuda asked for but torch sees no GPU; use --device cpu")
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
        self.aux_layer_ids = resolve_aux_layer_ids(config.layer_ids, self.num_layers)
        self.capture = capture_indices(self.aux_layer_ids)
        self.chunk_size = config.chunked_prefill_size if config.chunked_prefill_size > 0 else None
        self.max_batch_tokens = config.max_batch_tokens
        self.rid_prefix = config.rid_prefix
        self.dump_dir = Path(config.dump_dir)
        params = inspect.signature(self.base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # The last layer's output before the final norm: the input of the norm module.
        self._prenorm: torch.Tensor | None = None
        self.base.norm.register_forward_hook(self._grab_prenorm)
        self.sink: DumpSink | None = None
        if dump:
            self.sink = DumpSink(
                self.dump_dir, self._dump_source(), rid_prefix=self.rid_prefix, queue_size=config.dump_queue_size
            )
        self._inbox: queue.Queue[EngineRequest | None] = queue.Queue()
        self._waiting: deque[EngineRequest] = deque()
        self._chunking: deque[EngineRequest] = deque()
        self._stop = threading.Event()
        self.forward_seconds = 0.0
        self.forward_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="hsextract-scheduler", daemon=True)
        self._thread.start()

    def _grab_prenorm(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        self._prenorm = args[0]

    def _dump_source(self) -> DumpSource:
        return DumpSource(
            engine=ENGINE_NAME,
            engine_version=__version__,
            model_path=str(self.model_path),
            layer_ids=self.aux_layer_ids,
            capture_indices=self.capture,
            final_layer_id=self.num_layers - 1,
            final_norm_applied=True,
            provides_final_prenorm=True,
        )

    def info(self) -> ServerInfo:
        return ServerInfo(
            model_path=str(self.model_path),
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
            "disable_radix_cache": True,
        }

    @property
    def architecture(self) -> str:
        return str((self.config.architectures or [type(self.model).__name__])[0])

    # -- API --------------------------------------------------------------------------------------
    def submit(self, rid: str, input_ids: list[int]) -> Future[dict[str, Any]]:
        request = EngineRequest(rid=rid, input_ids=input_ids)
        self._inbox.put(request)
        return request.future

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join()
        if self.sink is not None:
            self.sink.flush()
            self.sink.close()

    # -- scheduler ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox(block=not (self._waiting or self._chunking))
            if self._stop.is_set():
                break
            try:
                self._step()
            except Exception:  # a failed forward fails its requests, not the server
                log.exception("forward failed")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block, timeout=0.5 if block else None)
        except queue.Empty:
            return
        while item is not None:
            self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
        self._stop.set()

    def _step(self) -> None:
        # Alternate: a long prompt's next chunk, then a batch of short prompts, so neither starves.
        if self._chunking:
            request = self._chunking.popleft()
            self._run_guarded([request], self._forward_chunk)
        batch = self._take_batch()
        if batch:
            self._run_guarded(batch, self._forward_batch)

    def _take_batch(self) -> list[EngineRequest]:
        batch: list[EngineRequest] = []
        longest = 0
        while self._waiting:
            request = self._waiting[0]
            length = len(request.input_ids)
            if self.chunk_size is not None and length > self.chunk_size:
                self._chunking.append(self._waiting.popleft())
                continue
            padded = max(longest, length) * (len(batch) + 1)
            if batch and padded > self.max_batch_tokens:
                break
            batch.append(self._waiting.popleft())
            longest = max(longest, length)
        return batch

    def _run_guarded(self, requests: list[EngineRequest], run: Any) -> None:
        try:
            run(requests)
        except Exception as exc:
            log.exception("forward of %s failed", [r.rid for r in requests])
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(exc)

    @torch.inference_mode()
    def _forward_batch(self, requests: list[EngineRequest]) -> None:
        lengths = [len(r.input_ids) for r in requests]
        longest = max(lengths)
        # Right padding: causal attention keeps real tokens from seeing the pad, positions stay 0..L-1.
        ids = torch.zeros((len(requests), longest), dtype=torch.int64)
        for index, request in enumerate(requests):
            ids[index, : lengths[index]] = torch.tensor(request.input_ids, dtype=torch.int64)
        started = time.perf_counter()
        out = self.base(input_ids=ids.to(self.device), output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        prenorm = self._prenorm
        assert prenorm is not None
        segments, parts_ids, parts_aux, parts_final, parts_prenorm = [], [], [], [], []
        row = 0
        for index, request in enumerate(requests):
            n = lengths[index]
            segments.append(Segment(request.rid, 0, row, n))
            parts_ids.append(ids[index, :n])
            parts_aux.append(torch.stack([states[c][index, :n] for c in self.capture], dim=1))
            parts_final.append(states[-1][index, :n])
            parts_prenorm.append(prenorm[index, :n])
            row += n
        self._emit(segments, parts_ids, parts_aux, parts_final, parts_prenorm)
        self._account(started, sum(lengths))
        for request, n in zip(requests, lengths, strict=True):
            request.future.set_result(self._response(request, n))

    @torch.inference_mode()
    def _forward_chunk(self, requests: list[EngineRequest]) -> None:
        import transformers

        (request,) = requests
        assert self.chunk_size is not None
        start = request.done_tokens
        end = min(len(request.input_ids), start + self.chunk_size)
        if request.cache is None:
            request.cache = transformers.DynamicCache(config=self.config)
        ids = torch.tensor([request.input_ids[start:end]], dtype=torch.int64)
        started = time.perf_counter()
        out = self.base(
            input_ids=ids.to(self.device),
            output_hidden_states=True,
            use_cache=True,
            **{self._cache_kwarg: request.cache},
        )
        states = out.hidden_states
        n = end - start
        aux = torch.stack([states[c][0, :n] for c in self.capture], dim=1)
        prenorm = self._prenorm
        assert prenorm is not None
        self._emit([Segment(request.rid, start, 0, n)], [ids[0]], [aux], [states[-1][0, :n]], [prenorm[0, :n]])
        self._account(started, n)
        request.done_tokens = end
        if end < len(request.input_ids):
            self._chunking.append(request)
        else:
            request.cache = None
            request.future.set_result(self._response(request, len(request.input_ids)))

    def _emit(
        self,
        segments: list[Segment],
        ids: list[torch.Tensor],
        aux: list[torch.Tensor],
        final: list[torch.Tensor],
        prenorm: list[torch.Tensor],
    ) -> None:
        self._prenorm = None
        if self.sink is None or not any(self.sink.wants(s.rid) for s in segments):
            return
        self.sink.submit(
            ExtendBatch(
                segments=segments,
                input_ids=torch.cat(ids).cpu(),
                aux=torch.cat(aux).cpu(),
                final=torch.cat(final).cpu(),
                final_prenorm=torch.cat(prenorm).cpu(),
            )
        )

    def _account(self, started: float, tokens: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - started
        self.forward_tokens += tokens

    @staticmethod
    def _response(request: EngineRequest, tokens: int) -> dict[str, Any]:
        # The shape of SGLang's /generate answer for max_new_tokens=0.
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": request.rid,
                "finish_reason": {"type": "length", "length": 0},
                "prompt_tokens": tokens,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - request.arrived,
            },
        }
