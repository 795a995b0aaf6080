"""A CUDA graph of the static-layout decode step: one replay where an eager step launches every kernel.

A decode step is one token a row: on a GPU its forward is far shorter than the time Python takes to
launch its kernels (on one H200 an 8B-shaped model's step took 22-30 ms eagerly, for about 3.4 ms of weight
reads), so the step is captured once and replayed. This needs the static layout
(:mod:`~hsextract.capture.embedded.static_kv`): fixed key and value buffers and fixed input tensors, the
mask built on the device from the positions. The graph runs every buffer row (the rows past the running
ones hold token 0 at column 0 and are not read), so one graph serves any number of running rows until the
buffers are reallocated (more rows or columns than they hold); then the next step captures again.

Capturing (``forward_graphs.GraphCapture``, as the forward graphs do) runs the step once eagerly on a side
stream first (lazy initialisations happen outside the capture), then records it, then replays it: a step
writes each row's key and value at its own column, from the same inputs each time, so running it twice
writes the same values. A capture that fails turns graphs off for the rest of the process and the steps
run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from hsextract.capture.embedded.forward_graphs import GraphCapture
from hsextract.capture.embedded.static_kv import StaticKV

log = logging.getLogger(__name__)


class StepGraphs:
    """The captured step of the current buffers (one at a time: a reallocation makes it stale)."""

    def __init__(self, device: torch.device) -> None:
        self._graph: Any = None
        self._output: torch.Tensor | None = None
        self._generation = -1
        self._capturer = GraphCapture(device)
        self.enabled = True
        self.captured = 0

    def run(self, kv: StaticKV, step: Callable[[int], torch.Tensor]) -> torch.Tensor | None:
        """The final states of every buffer row after one replay (valid until the next), capturing first when
        the buffers are new; ``step(rows)`` runs the step of the first ``rows`` rows. None: run it eagerly."""
        if not self.enabled:
            return None
        if self._generation != kv.generation:
            self._graph = self._output = None  # its memory goes back to the pool before the next capture
            try:
                self._capture(kv, step)
            except Exception:
                self.enabled = False
                log.exception("capturing the decode step of %s rows x %s columns failed: decode graphs are off from now on",
                              *kv.capacity)  # fmt: skip
                return None
        self._graph.replay()
        return self._output

    def drop(self) -> None:
        """Forget the graph (its buffers were freed): its memory goes back to the pool."""
        self._graph = self._output = None
        self._generation = -1

    def _capture(self, kv: StaticKV, step: Callable[[int], torch.Tensor]) -> None:
        rows = kv.capacity[0]
        self._graph, self._output = self._capturer.capture(lambda: step(rows))
        self._generation = kv.generation
        self.captured += 1
        log.info("captured the decode step of %d rows x %d columns", *kv.capacity)
