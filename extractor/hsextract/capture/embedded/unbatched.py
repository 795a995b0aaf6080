"""The embedded engine's answer to a spot check: the row alone, in one forward (batch 1, no chunking).

What SGLang's ``return_hidden_states`` gives with aux capture on (the aux states packed ``[T, K*H]``),
plus the final state after and before the final norm and the layers either side of the first aux layer;
compared by the extractor with what the batched path dumped.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hsextract.capture.embedded.request import EngineRequest
from hsextract.capture.stages import StageClock
from hsextract.contract.spot_check import SpotCheckAnswer

log = logging.getLogger(__name__)


class CheckThread:
    """Runs the spot checks one at a time on a thread of its own, each to its answer.

    The scheduler thread only hands a check over: launching a batch-1 forward is bound by its Python (0.24-0.29 s
    of host time for a Kimi-shaped MoE on the H200), and on the scheduler that time went by with no batch
    launched, so the device ran dry behind the check. Here the check's launches run while the scheduler waits
    for room in the device's queue (PyTorch lets go of the GIL in each launch and each wait)."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsextract-spot-check")

    def submit(self, request: EngineRequest, answer: Callable[[EngineRequest], SpotCheckAnswer]) -> None:
        self._thread.submit(_resolve, request, answer)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


def _resolve(request: EngineRequest, answer: Callable[[EngineRequest], SpotCheckAnswer]) -> None:
    try:
        request.future.set_result(answer(request))
    except Exception as exc:  # a failed check fails its request, not the server
        log.exception("spot check of %s failed", request.rid)
        request.future.set_exception(exc)


def move_spot_checks(waiting: deque[EngineRequest], alone: deque[EngineRequest]) -> deque[EngineRequest]:
    """Spot checks run alone, never in a batch: they go to ``alone``; the rest is returned."""
    if not any(r.spot_check for r in waiting):
        return waiting
    alone.extend(r for r in waiting if r.spot_check)
    return deque(r for r in waiting if not r.spot_check)


@torch.inference_mode()
def answer_alone(
    base: Any,
    request: EngineRequest,
    device: torch.device,
    capture: list[int],
    cache: Any,
    prenorm: Callable[[], Any],
    stream: torch.cuda.Stream | None,
    clock: StageClock,
) -> SpotCheckAnswer:
    """One unbatched forward of the row, on the check's thread (:class:`CheckThread`), and its states on the host.
    ``prenorm`` gives the input of the final norm in this thread's last forward (the engine's own hook keeps it).

    On a GPU (``stream`` given) everything runs on that stream of the check's own: a batch-1 forward is bound
    by its Python launch, and on the forwards' stream the device would run nothing else while its kernels
    trickle in. The states are copied to pinned host memory and the thread waits on that copy's event alone:
    a blocking copy from the device would wait for every forward queued before it.
    ``clock`` gets the launch's host time (``spot_check``) and the forward's span (``spot_check_forward``)."""
    on_gpu = stream is not None
    with torch.cuda.stream(stream) if on_gpu else contextlib.nullcontext():
        began = time.perf_counter()
        started = recorded_event(on_gpu)
        ids = torch.tensor(request.input_ids, dtype=torch.int64).unsqueeze(0)
        if on_gpu:  # a copy from pageable memory waits for every forward queued before it
            ids = ids.pin_memory()
        ids = ids.to(device, non_blocking=True)
        states = base(input_ids=ids, output_hidden_states=True, **cache).hidden_states
        before_norm = prenorm()
        if before_norm is None:
            raise RuntimeError("the pre-norm hook on the model's final norm did not run")
        aux = torch.cat([states[c][0] for c in capture], dim=-1)  # the engine's dtype: half the copy of float32
        final, before = states[-1][0], before_norm[0]
        neighbours = torch.cat([states[capture[0] - 1][0], states[capture[0] + 1][0]], dim=-1)
        found = (aux, final, before, neighbours)
        forwarded = recorded_event(on_gpu)
        clock.observe("spot_check", time.perf_counter() - began)
        if not on_gpu:
            clock.observe("spot_check_forward", time.perf_counter() - began)
            return SpotCheckAnswer(request.rid, *found)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in found]
        for target, source in zip(host, found, strict=True):
            target.copy_(source, non_blocking=True)
        copied = recorded_event(on_gpu)
    copied.synchronize()
    clock.observe("spot_check_forward", float(started.elapsed_time(forwarded)) / 1e3)
    return SpotCheckAnswer(request.rid, *host)


def recorded_event(on_gpu: bool) -> Any:
    """A timing event recorded on the current stream now (None on the CPU)."""
    if not on_gpu:
        return None
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event
