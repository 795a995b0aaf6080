"""The one device-to-host path of the SGLang hook and the embedded engine.

A device-to-host copy into pageable memory is synchronous and slow (1.1 GB/s measured on an H200
host for a 470 MB chunk); into pinned memory it is asynchronous and fast (54 GB/s). Pinning is
expensive, so buffers are allocated once and reused. The pool is bounded: when every buffer is
still waiting for the writer, ``acquire`` blocks, which is the back-pressure that keeps host
memory bounded when tmpfs is slower than the forward (``wait_pinned`` on the stage clock says how
long). Once the pool is reserved at a size, a kind first used later (the pre-norm rows, FP8 rows)
is grown to that size at once: grown batch by batch, a slot was pinned again for each batch larger
than any before (a tenth of the scheduler thread's samples in a profile of FP8 rows on an H200).

:class:`HostCopier` takes one extend batch's rows already laid out on the device (``aux`` stacked
``[n, K, H]`` there, so each kind is one contiguous copy), queues their copies into a pooled
pinned buffer on a side stream that waits for the forward's stream, and returns the
:class:`ExtendBatch` the :class:`DumpSink` consumes: its ``ready`` event is what the sink's
thread waits on, so the forward thread never synchronizes with the device.

Rows of requests dumped as FP8 arrive already quantized on the device (:class:`Fp8Rows`: one byte
per state and a float32 scale per token), so their copy and their pinned buffers are half the size;
the FP8 buffers are grown only for batches that carry such rows, and the model-dtype path does no
extra work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from hsextract.capture.dump_sink import ExtendBatch, Fp8Rows, Segment
from hsextract.capture.stages import StageClock
from hsextract.contract.files.fp8 import FP8_DTYPE
from hsextract.contract.files.tensor_file import tiled


class PinnedBuffer:
    """One flat buffer per tensor kind, viewed into the shapes of each batch."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.ids = torch.empty(0, dtype=torch.int64)
        self.aux = self.final = self.prenorm = torch.empty(0)
        self.fp8_ids = torch.empty(0, dtype=torch.int64)
        self.fp8 = torch.empty(0, dtype=FP8_DTYPE)
        self.scales = torch.empty(0, dtype=torch.float32)

    def ensure(self, tokens: int, num_aux: int, hidden: int, dtype: torch.dtype, prenorm: bool, fp8_tokens: int = 0) -> None:
        """Grow (never shrink) to hold ``tokens`` rows of ``num_aux`` + 1 states (+1 with ``prenorm``),
        and ``fp8_tokens`` FP8 rows of ``num_aux`` + 1 states with their scales."""
        # Normal tensors even when first grown inside a forward's inference mode: an inference
        # tensor could not be written to by a later call from outside it.
        with torch.inference_mode(False):
            self._grow(tokens, num_aux, hidden, dtype, prenorm)
            if fp8_tokens:
                self._grow_fp8(fp8_tokens, (num_aux + 1) * hidden)

    def _grow_fp8(self, tokens: int, per_token: int) -> None:
        if self.fp8_ids.numel() < tokens:
            self.fp8_ids = torch.empty(tokens, dtype=torch.int64, pin_memory=self.pin)
            self.scales = torch.empty(tokens, dtype=torch.float32, pin_memory=self.pin)
        if self.fp8.numel() < tokens * per_token:
            self.fp8 = torch.empty(tokens * per_token, dtype=FP8_DTYPE, pin_memory=self.pin)

    def _grow(self, tokens: int, num_aux: int, hidden: int, dtype: torch.dtype, prenorm: bool) -> None:
        states = tokens * hidden
        if self.ids.numel() < tokens:
            self.ids = torch.empty(tokens, dtype=torch.int64, pin_memory=self.pin)
        if self.final.dtype != dtype or self.final.numel() < states:
            self.final = torch.empty(states, dtype=dtype, pin_memory=self.pin)
        if prenorm and (self.prenorm.dtype != dtype or self.prenorm.numel() < states):
            self.prenorm = torch.empty(states, dtype=dtype, pin_memory=self.pin)
        if self.aux.dtype != dtype or self.aux.numel() < states * num_aux:
            self.aux = torch.empty(states * num_aux, dtype=dtype, pin_memory=self.pin)


class PinnedPool:
    def __init__(self, slots: int, pin: bool, clock: StageClock | None = None) -> None:
        self._free: list[PinnedBuffer] = []
        self._created = 0
        self._slots = slots
        self._pin = pin
        self._cond = threading.Condition()
        self._clock = clock
        self._reserved_tokens = 0  # every kind a batch uses is grown to at least this many rows

    @property
    def slots(self) -> int:
        return self._slots

    def acquire(
        self, tokens: int, num_aux: int, hidden: int, dtype: torch.dtype, prenorm: bool = False, fp8_tokens: int = 0
    ) -> PinnedBuffer:
        started = time.perf_counter()
        with self._cond:
            while not self._free and self._created >= self._slots:
                self._cond.wait()
            if self._free:
                buffer = self._free.pop()
            else:
                self._created += 1
                buffer = PinnedBuffer(self._pin)
        if self._clock is not None:
            self._clock.observe("wait_pinned", time.perf_counter() - started)
        floor = self._reserved_tokens
        try:
            buffer.ensure(max(tokens, floor), num_aux, hidden, dtype, prenorm, max(fp8_tokens, floor) if fp8_tokens else 0)
        except BaseException:
            self.release(buffer)
            raise
        return buffer

    def release(self, buffer: PinnedBuffer) -> None:
        with self._cond:
            self._free.append(buffer)
            self._cond.notify()

    def reserve(
        self, tokens: int, num_aux: int, hidden: int, dtype: torch.dtype, prenorm: bool = False, fp8_tokens: int = 0
    ) -> None:
        """Allocate every slot at this size now, and any kind a later batch first uses at this size too, so no
        forward waits for pinning more than once per slot and kind."""
        self._reserved_tokens = max(self._reserved_tokens, tokens)
        buffers = [self.acquire(tokens, num_aux, hidden, dtype, prenorm, fp8_tokens) for _ in range(self._slots)]
        for buffer in buffers:
            self.release(buffer)


class HostCopier:
    """Copies one batch's device rows to the host without holding the forward thread."""

    def __init__(self, slots: int, pin: bool | None = None, clock: StageClock | None = None) -> None:
        self.pool = PinnedPool(slots, torch.cuda.is_available() if pin is None else pin, clock)
        self._streams: dict[int, Any] = {}

    def _stream(self, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return stream

    def copy(
        self,
        segments: Sequence[Segment],
        input_ids: torch.Tensor,
        final: torch.Tensor,
        aux: torch.Tensor,
        prenorm: torch.Tensor | None = None,
        *,
        private: bool = False,
        spans: Sequence[tuple[str, Any, Any]] = (),
        fp8: Fp8Rows | None = None,
    ) -> ExtendBatch:
        """``input_ids [n]``, ``final [n, H]``, ``aux [n, K, H]``, ``prenorm [n, H]``, rows in batch order;
        ``fp8`` the rows of the FP8 segments (on the same device), copied as they are.

        On a CUDA device the copies are queued on a side stream after everything queued so far on
        the current stream; the batch's ``ready`` event marks their end. On the CPU, ``private``
        tensors (fresh, owned by this batch) are handed over as they are; others are not, since
        the caller may overwrite them before the sink's thread reads them: they are copied into a
        pooled buffer, synchronously.
        """
        n = int(final.shape[0])
        if aux.dim() != 3 or int(aux.shape[0]) != n or int(aux.shape[2]) != int(final.shape[-1]):
            raise ValueError(f"aux must be [n, K, H] with n={n}, H={final.shape[-1]}; got {tuple(aux.shape)}")
        if private and not final.is_cuda:
            if fp8 is not None:
                fp8 = Fp8Rows(fp8.input_ids.cpu(), fp8.hidden_states, fp8.scales, fp8.model_dtype)
            return ExtendBatch(segments, input_ids.cpu(), aux, final, prenorm, spans=spans, fp8=fp8)
        num_aux, width = int(aux.shape[1]), int(final.shape[-1])
        fp8_tokens = 0
        if fp8 is not None:
            fp8_tokens = int(fp8.hidden_states.shape[0])
            if tuple(fp8.hidden_states.shape[1:]) != (num_aux + 1, width) or fp8.hidden_states.dtype != FP8_DTYPE:
                got = f"{fp8.hidden_states.dtype} {tuple(fp8.hidden_states.shape)}"
                raise ValueError(f"fp8 hidden_states must be [m, {num_aux + 1}, {width}] {FP8_DTYPE}; got {got}")
        # aux and the pre-norm state as the slot ranges of one [n, K+1, H] tensor (the engine's): one copy into one
        # host tensor, and the host rows are views of it the same way (a stacked dump is written from it as it is)
        stacked = None if prenorm is None else tiled((aux, prenorm.unsqueeze(1)))
        slots = num_aux + (stacked is not None)
        apart = prenorm is not None and stacked is None
        buffer = self.pool.acquire(n, slots, width, final.dtype, prenorm=apart, fp8_tokens=fp8_tokens)
        states = n * width
        ids_host = buffer.ids[:n]
        final_host = buffer.final[:states].view(n, width)
        pairs = [(ids_host, input_ids), (final_host, final)]
        prenorm_host = None
        if stacked is not None:
            stacked_host = buffer.aux[: states * slots].view(n, slots, width)
            aux_host, prenorm_host = stacked_host[:, :num_aux], stacked_host[:, num_aux]
            pairs.append((stacked_host, stacked))
        else:
            aux_host = buffer.aux[: states * num_aux].view(n, num_aux, width)
            pairs.append((aux_host, aux))
            if prenorm is not None:
                prenorm_host = buffer.prenorm[:states].view(n, width)
                pairs.append((prenorm_host, prenorm))
        fp8_host: Fp8Rows | None = None
        if fp8 is not None:
            fp8_host = Fp8Rows(
                buffer.fp8_ids[:fp8_tokens],
                buffer.fp8[: fp8_tokens * (num_aux + 1) * width].view(fp8_tokens, num_aux + 1, width),
                buffer.scales[:fp8_tokens].view(fp8_tokens, 1, 1),
                fp8.model_dtype,
            )
            pairs += [
                (fp8_host.input_ids, fp8.input_ids),
                (fp8_host.hidden_states, fp8.hidden_states),
                (fp8_host.scales, fp8.scales),
            ]
        ready: Any = None
        try:
            if final.is_cuda:
                ready, spans = self._copy_on_side_stream(pairs, final.device, spans)
            else:
                for target, source in pairs:
                    target.copy_(source)
        except BaseException:
            self.pool.release(buffer)
            raise
        return ExtendBatch(
            segments=segments,
            input_ids=ids_host,
            aux=aux_host,
            final=final_host,
            final_prenorm=prenorm_host,
            ready=ready,
            release=lambda: self.pool.release(buffer),
            spans=spans,
            fp8=fp8_host,
        )

    def _copy_on_side_stream(
        self, pairs: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device, spans: Sequence[tuple[str, Any, Any]]
    ) -> tuple[Any, list[tuple[str, Any, Any]]]:
        stream = self._stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ready = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            start.record(stream)
            for target, source in pairs:
                target.copy_(source, non_blocking=True)
            ready.record(stream)
        # The caching allocator must not hand the sources' memory to anyone before the copies end.
        for _, source in pairs:
            if source.is_cuda:
                source.record_stream(stream)
        return ready, [*spans, ("d2h", start, ready)]
