"""CUDA graphs of the batched whole-prompt forward: one replay where an eager forward launches every kernel.

On a small model the GPU runs a batch in less time than Python takes to launch it. Each of the forward's
hundreds of operators gives the interpreter lock back and takes it again, and the server's dump writers and
HTTP front want it too: on one H200 a 4-layer hidden-384 model took 15 ms to launch a batch, whatever the
switch interval, and the GPU waited on the launch (``bench/results-gpu-e2e-graphs.json``). A captured graph
launches the same kernels in one call.

A graph serves one padded shape ``[rows, length]``: a batch is padded up to its bucket (rows to a power of
two, length to a multiple of :data:`LENGTH_STEP`) with token 0. The padding is on the right of each row and
in whole extra rows, where causal attention keeps it from every real token, as in the engine's own eager
batches. Graphs are captured on first use of a shape (after one eager warm-up forward on the capture
stream), up to :data:`MAX_GRAPHS`; they share one memory pool. Each keeps only the outputs the engine reads
(the capture layers, the final state and the pre-norm one); those are overwritten by every later replay
of any graph, so the caller gathers its rows from them before the next replay on the same stream (the
engine does: the gather is queued right behind the replay). A capture that fails turns graphs off for the
rest of the process, and the batch runs eagerly.

``auto`` (the default) uses graphs for models of at most :data:`AUTO_MAX_PARAMETERS` parameters outside the
embeddings, where a forward of a few thousand tokens takes the GPU less time than its launch; above that the
launch hides behind the computation and padding to a bucket would cost more than it saves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")

LENGTH_STEP = 64  # a bucket's length is a multiple of this: at most 63 pad columns a row
MAX_GRAPHS = 64  # shapes captured at most; a batch of any other shape runs eagerly
AUTO_MAX_PARAMETERS = 100_000_000  # "auto": graphs for models this small (parameters outside the embeddings)

#: the engine's forward: padded ids on the device -> (hidden states as transformers returns them, the pre-norm state)
Forward = Callable[[torch.Tensor], tuple[Sequence[torch.Tensor], torch.Tensor | None]]
#: in a graph's hidden states, where the engine reads nothing (not kept: its memory goes back to the pool)
NOT_KEPT = torch.empty(0)


def use_graphs(setting: str, cuda: bool, parameters: int) -> bool:
    """Whether the engine captures its batched forwards (``--cuda-graphs`` auto, on or off)."""
    if not cuda or setting == "off":
        return False
    return setting == "on" or parameters <= AUTO_MAX_PARAMETERS


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters of ``model`` outside its input embeddings: what a token's forward computes with."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    skip = {id(p) for p in embeddings.parameters()} if isinstance(embeddings, torch.nn.Module) else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def bucket(rows: int, length: int, max_tokens: int) -> tuple[int, int] | None:
    """The padded shape a batch of ``rows`` rows of at most ``length`` tokens runs in; None when the padded
    batch would exceed ``max_tokens`` (it then runs eagerly, unpadded)."""
    padded_rows = 1 << max(0, rows - 1).bit_length()
    padded_length = -(-length // LENGTH_STEP) * LENGTH_STEP
    return (padded_rows, padded_length) if padded_rows * padded_length <= max_tokens else None


class GraphCapture:
    """One memory pool and side stream for a family of graphs, and how each is captured: ``run`` once eagerly on
    the side stream (lazy initialisations such as cuBLAS workspaces and kernel choices happen outside the
    capture), then recorded there. The forward graphs and the decode step's (step_graphs.py) both capture so."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._pool: Any = None
        self._stream: Any = None

    def capture(self, run: Callable[[], T]) -> tuple[Any, T]:
        """The recorded graph (``torch.cuda.CUDAGraph``) and what ``run`` returned while recording (its static
        outputs, overwritten by every replay); raises where ``run`` cannot be captured (or there is no GPU)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            run()
        current.wait_stream(self._stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the other scheduler threads (spot check, decode, extraction) may launch their own forwards
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
            output = run()
        return graph, output


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    ids: torch.Tensor  # the static input the replay reads [rows, length], on the device
    states: list[torch.Tensor]  # transformers' hidden_states, NOT_KEPT where the engine reads nothing
    prenorm: torch.Tensor | None


class ForwardGraphs:
    """The captured forwards of one engine, by padded shape."""

    def __init__(self, forward: Forward, wanted: Sequence[int], device: torch.device) -> None:
        self._forward = forward
        self._wanted = set(wanted)  # indexes into hidden_states the engine reads (-1: the final state)
        self._device = device
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._capturer = GraphCapture(device)
        self.enabled = True

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def run(self, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None] | None:
        """Replay the graph of ``ids``'s shape (pinned host ids, padded to a bucket) on the current stream,
        capturing it first if need be; its outputs stay valid until the next replay. None: run it eagerly."""
        shape = (int(ids.shape[0]), int(ids.shape[1]))
        graph = self._graphs.get(shape)
        if graph is None:
            if not self.enabled or len(self._graphs) >= MAX_GRAPHS:
                return None
            try:
                graph = self._capture(shape)
            except Exception:
                self.enabled = False
                log.exception("capturing the forward of shape %s failed: CUDA graphs are off from now on", shape)
                return None
            self._graphs[shape] = graph
        graph.ids.copy_(ids, non_blocking=True)
        graph.graph.replay()
        return graph.states, graph.prenorm

    def _capture(self, shape: tuple[int, int]) -> _Graph:
        ids = torch.zeros(shape, dtype=torch.int64, device=self._device)
        graph, (states, prenorm) = self._capturer.capture(lambda: self._forward(ids))
        kept = [s if i in self._wanted or i - len(states) in self._wanted else NOT_KEPT for i, s in enumerate(states)]
        log.info("captured the forward of %d rows x %d tokens (%d graphs)", shape[0], shape[1], len(self._graphs) + 1)
        return _Graph(graph, ids, kept, prenorm)
