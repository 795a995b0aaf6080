"""The SGLang forward hook: dump every prompt token's aux and final hidden states.

Registered through SGLang's ``--forward-hooks`` server argument on the model's
``logits_processor`` (``hsextract launch-sglang`` writes the spec)::

    [{"name": "hsextract_dump", "target_modules": ["logits_processor"],
      "hook_factory": "hsextract.capture.sglang.hook:make_hook",
      "config": {"dump_dir": "/dev/shm/hsextract", "layer_ids": [2, 30, 58]}}]

``LogitsProcessor.forward`` is called as ``(input_ids, hidden_states, lm_head, forward_batch,
aux_hidden_states)``: the hidden states are the final post-norm ones, the aux states are already
reduced across TP ranks (a list of K ``[n, H]`` tensors, or one packed ``[n, K*H]`` tensor for
DeepSeek). An optional second hook, ``make_prenorm_hook`` on ``model.norm``, adds the final layer's
output before the norm (for the speculators format).

On every extend pass the hook takes the first ``sum(extend_seq_lens_cpu)`` rows (the rest is
padding), copies the rows of extractor rids (a list-form aux stacked on the device first) into a
reusable pinned buffer on a side stream through the :class:`HostCopier` the embedded engine uses too,
and hands the batch to the :class:`DumpSink`, whose threads assemble chunks by (rid, position) and
write the dumps. With ``storage: float8_e4m3fn`` in the config every dumped request's rows are stacked
``[aux..., final]`` (the pre-norm final with ``final_prenorm``) and quantized per token on the device
(``contract.fp8``) before the copy: SGLang does not pass custom ``/generate`` keys to the hook, so the
storage is the server's, and each dump's meta.json ``storage_dtype`` tells the extractor.
The forward thread is held for launching the copy only. Nothing here ever raises into the
server's forward: a failure is logged and leaves an ``error`` marker for the extractor to retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hsextract.capture.dump_sink import DumpSink, Fp8Rows, Segment
from hsextract.capture.pinned import HostCopier
from hsextract.capture.stages import StageClock
from hsextract.contract.files.dumps import DumpSource, write_error_marker
from hsextract.contract.files.fp8 import quantize_per_token
from hsextract.contract.hook_config import HookConfig
from hsextract.contract.layers import capture_indices
from hsextract.contract.model_fingerprint import model_fingerprint
from hsextract.contract.rids import parse_rid

log = logging.getLogger(__name__)

Hook = Callable[[torch.nn.Module, tuple[Any, ...], Any], None]


def is_writer_rank() -> bool:
    """TP rank 0 writes (the residual stream is identical on every rank after the all-reduce);
    with attention data parallelism, attention-TP rank 0 of each group."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().attn_tp_rank) == 0
    except (ImportError, RuntimeError, AttributeError):
        pass
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return True


class HiddenStateDumper:
    """Per-process state shared by the logits-processor hook and the pre-norm hook."""

    def __init__(self, config: HookConfig) -> None:
        self.config = config
        layer_ids = None if config.layer_ids is None else list(config.layer_ids)
        source = DumpSource(
            engine="sglang",
            engine_version=_sglang_version(),
            model_path=config.model_path,
            model_fingerprint=model_fingerprint(config.model_path) if config.model_path else None,
            layer_ids=layer_ids,
            capture_indices=None if layer_ids is None else capture_indices(layer_ids),
            final_norm_applied=True,
            provides_final_prenorm=config.final_prenorm,
        )
        self.clock = StageClock()
        self.sink = DumpSink(
            config.dump_dir,
            source,
            rid_prefix=config.rid_prefix,
            queue_size=config.queue_size,
            writers=config.dump_writers,
            clock=self.clock,
        )
        self.copier = HostCopier(slots=config.queue_size + 2, clock=self.clock)
        self._prenorm: torch.Tensor | None = None
        self._last_error_log = 0.0
        self.forward_seconds = 0.0  # time the forward thread spent in the hook (benchmarks read it)

    # -- hooks ------------------------------------------------------------------------------------------
    def on_norm(self, args: tuple[Any, ...], output: Any) -> None:
        hidden = args[0]
        residual = args[1] if len(args) > 1 else None
        # SGLang's fused RMSNorm(x, residual) normalises x + residual: that sum is the pre-norm state.
        self._prenorm = hidden if residual is None else hidden + residual

    def on_logits(self, args: tuple[Any, ...]) -> None:
        started = time.perf_counter()
        wanted: list[Segment] = []
        try:
            input_ids, hidden, batch = args[0], args[1], args[3]
            aux = args[4] if len(args) > 4 else None
            prenorm, self._prenorm = self._prenorm, None
            segments = self._segments(batch)
            if segments is None:
                return
            wanted = [s for s in segments if self.sink.wants(s.rid)]
            if not wanted:
                return
            if aux is None:
                raise RuntimeError(
                    "the server passes no aux hidden states: start it with --enable-return-aux-hidden-states "
                    "(hsextract launch-sglang does)"
                )
            if self.config.final_prenorm and prenorm is None:
                raise RuntimeError("final_prenorm is set but the pre-norm hook on model.norm did not run")
            self._copy_and_submit(wanted, input_ids, hidden, aux, prenorm if self.config.final_prenorm else None)
        except Exception as exc:  # never into the forward
            self._report(exc, wanted)
        finally:
            self.forward_seconds += time.perf_counter() - started

    # -- internals ----------------------------------------------------------------------------------------
    @staticmethod
    def _segments(batch: Any) -> list[Segment] | None:
        mode = batch.forward_mode
        extend_only = getattr(mode, "is_extend_without_speculative", None)
        if not (extend_only() if extend_only is not None else mode.is_extend()):
            return None  # decode, idle, speculative verify: no prompt tokens here
        rids = batch.rids
        lens = batch.extend_seq_lens_cpu
        prefixes = batch.extend_prefix_lens_cpu
        if rids is None or lens is None or prefixes is None:
            return None
        segments: list[Segment] = []
        start = 0
        for rid, length, prefix in zip(rids, lens, prefixes, strict=True):
            segments.append(Segment(rid, int(prefix), start, int(length)))
            start += int(length)
        return segments

    def _copy_and_submit(
        self,
        wanted: Sequence[Segment],
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        aux: torch.Tensor | Sequence[torch.Tensor],
        prenorm: torch.Tensor | None,
    ) -> None:
        # Copy only the row range that holds wanted requests; shift their start rows to match.
        low = min(s.start_row for s in wanted)
        high = max(s.start_row + s.num_rows for s in wanted)
        rows = high - low
        width = int(hidden.shape[-1])
        num_aux = int(aux.shape[-1]) // width if isinstance(aux, torch.Tensor) else len(aux)
        if self.config.layer_ids is not None and num_aux != len(self.config.layer_ids):
            configured = list(self.config.layer_ids)
            raise RuntimeError(f"the server captures {num_aux} aux layers, the hook is configured for {configured}")
        if self.config.storage is not None:
            self._submit_fp8(wanted, low, high, input_ids, hidden, aux, prenorm)
            return
        if isinstance(aux, torch.Tensor):  # DeepSeek packs them [n, K*H]: a view, no copy
            aux_rows = aux[low:high].reshape(rows, num_aux, width)
        else:  # a list of K [n, H]: stacked on the device, so the host gets one copy instead of K
            aux_rows = torch.stack([a[low:high] for a in aux], dim=1)
        self.sink.submit(
            self.copier.copy(
                [Segment(s.rid, s.prefix_len, s.start_row - low, s.num_rows) for s in wanted],
                input_ids[low:high],
                hidden[low:high],
                aux_rows,
                None if prenorm is None else prenorm[low:high],
            )
        )

    def _submit_fp8(
        self,
        wanted: Sequence[Segment],
        low: int,
        high: int,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        aux: torch.Tensor | Sequence[torch.Tensor],
        prenorm: torch.Tensor | None,
    ) -> None:
        """Stack ``[aux..., final]`` for rows ``low:high`` on the device, quantize per token there, and
        copy only the FP8 bytes and scales."""
        rows, width = high - low, int(hidden.shape[-1])
        final = (hidden if prenorm is None else prenorm)[low:high]
        if isinstance(aux, torch.Tensor):
            stacked = torch.cat([aux[low:high].reshape(rows, -1, width), final.unsqueeze(1)], dim=1)
        else:
            stacked = torch.stack([*(a[low:high] for a in aux), final], dim=1)
        quantized, scales = quantize_per_token(stacked)
        fp8 = Fp8Rows(input_ids[low:high], quantized, scales, str(hidden.dtype).removeprefix("torch."))
        empty = hidden.new_empty((0, width))
        segments = [
            Segment(s.rid, s.prefix_len, s.start_row - low, s.num_rows, prenorm is not None, self.config.storage) for s in wanted
        ]
        self.sink.submit(
            self.copier.copy(segments, input_ids.new_empty(0), empty, empty.reshape(0, stacked.shape[1] - 1, width), fp8=fp8)
        )

    def _report(self, exc: Exception, wanted: Sequence[Segment]) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 10:
            self._last_error_log = now
            log.exception("hsextract dump hook failed (reported to the extractor through error markers)")
        for segment in wanted:
            if parse_rid(segment.rid, self.config.rid_prefix) is not None:
                try:
                    write_error_marker(self.config.dump_dir, segment.rid, f"dump hook failed: {type(exc).__name__}: {exc}")
                except Exception:
                    log.error("could not write the error marker of %s", segment.rid)


def _sglang_version() -> str:
    try:
        import sglang

        return str(sglang.__version__)
    except Exception:
        return "unknown"


_DUMPERS: dict[Path, HiddenStateDumper] = {}
_DUMPERS_LOCK = threading.Lock()


def _dumper(config: HookConfig) -> HiddenStateDumper:
    with _DUMPERS_LOCK:
        dumper = _DUMPERS.get(config.dump_dir)
        if dumper is None:
            dumper = _DUMPERS[config.dump_dir] = HiddenStateDumper(config)
        return dumper


def make_hook(config: dict[str, Any]) -> Hook | None:
    """Hook factory for ``--forward-hooks`` on ``logits_processor``. None on non-writer ranks
    (SGLang then registers nothing there)."""
    parsed = HookConfig.parse(config)
    if not is_writer_rank():
        log.info("hsextract dump hook: not the writer rank, not dumping here")
        return None
    dumper = _dumper(parsed)
    log.info("hsextract dump hook: dumping rids %s-* to %s", parsed.rid_prefix, parsed.dump_dir)

    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        dumper.on_logits(args)

    return hook


def make_prenorm_hook(config: dict[str, Any]) -> Hook | None:
    """Hook factory for ``--forward-hooks`` on ``model.norm``: keeps the pre-norm final state for
    the next logits-processor call (same config as :func:`make_hook`, with ``final_prenorm: true``)."""
    parsed = HookConfig.parse(config)
    if not is_writer_rank():
        return None
    dumper = _dumper(parsed)

    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        try:
            dumper.on_norm(args, output)
        except Exception:
            log.exception("hsextract pre-norm hook failed")

    return hook
