"""Checks every dump passes before it is packed: tokens, shapes, dtype, layers, finiteness."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hsextract.contract.files import fp8
from hsextract.contract.files.dumps import FINAL_SLOT_PRENORM, Dump, postnorm_missing
from hsextract.contract.files.finite import all_finite
from hsextract.contract.layers import CAPTURE_NUMBERING, LAYER_IDS_NUMBERING
from hsextract.contract.states import ErrorReason
from hsextract.errors import DumpError, LayerMismatchError, ModelMismatchError, StorageMismatchError


@dataclass(frozen=True)
class DumpExpectation:
    aux_layer_ids: list[int]
    capture_indices: list[int]
    hidden_size: int
    dtype: str | None  # None: accept the first dump's dtype (then pinned by the pipeline)
    need_final_prenorm: bool
    model_path: str = ""  # the output's model (identity.py); "" : not checked
    model_fingerprint: str | None = None
    storage: str | None = None  # the output's: fp8.FP8_STORAGE, or None for the model's dtype


class Expectations:
    """The run's :class:`DumpExpectation`. A server that does not say its dtype has it pinned by the first dump
    (``on_pin`` records it and answers the dtype to expect); until then :meth:`known` is None."""

    def __init__(self, expect: DumpExpectation, on_pin: Callable[[str], str | None] | None = None) -> None:
        self._expect = expect
        self._on_pin = on_pin if expect.dtype is None else None
        self._lock = threading.Lock()

    def known(self) -> DumpExpectation | None:
        """What every dump must be, once nothing is left to learn from a dump; else None."""
        return self._expect if self._on_pin is None else None

    def for_dump(self, dump: Dump) -> DumpExpectation:
        """What this dump must be; the first dump of a run whose dtype is not known pins it."""
        if self._on_pin is not None:
            with self._lock:
                if self._on_pin is not None:
                    self._expect = replace(self._expect, dtype=self._on_pin(dump.model_dtype))
                    self._on_pin = None
        return self._expect


def _same_model(dump: Dump, expect: DumpExpectation) -> bool:
    source = dump.meta.source
    if expect.model_fingerprint is not None and source.model_fingerprint is not None:
        return source.model_fingerprint == expect.model_fingerprint
    if not expect.model_path or not source.model_path:
        return True  # the writer does not say (a hook without model_path): the layers and shapes still are checked
    return os.path.normpath(source.model_path) == os.path.normpath(expect.model_path)


def check_dump(dump: Dump, sent_ids: list[int], expect: DumpExpectation, *, values: bool = True) -> None:
    """DumpError (or its kinds) when the dump is not what the run expects. ``values=False`` leaves out the pass over
    the states that finds NaN and infinity, for a format that checks each value as it writes it
    (``OutputFormat.checks_values_as_written``): the pass read tens of MB a wide row a second time (issue 37)."""
    tokens = len(sent_ids)
    if not _same_model(dump, expect):
        source = dump.meta.source
        raise ModelMismatchError(
            ErrorReason.MODEL_MISMATCH,
            f"dump {dump.rid} was written by model {source.model_path} (fingerprint {source.model_fingerprint}) but this "
            f"output holds model {expect.model_path} (fingerprint {expect.model_fingerprint}): the server was restarted "
            "on another model. Restart it on the output's model and rerun, or use a new --output",
        )
    meta_layers = dump.meta.source.layer_ids
    meta_capture = dump.meta.source.capture_indices
    if meta_layers != expect.aux_layer_ids or meta_capture != expect.capture_indices:
        raise LayerMismatchError(
            ErrorReason.LAYER_MISMATCH,
            f"dump {dump.rid} was captured at layer_ids {meta_layers} (capture indices {meta_capture}) but the run "
            f"expects layer_ids {expect.aux_layer_ids} (capture indices {expect.capture_indices}); restart the server "
            f"with the configured layers or fix layer_ids ({LAYER_IDS_NUMBERING}; {CAPTURE_NUMBERING})",
        )
    if dump.input_ids.shape != (tokens,) or not torch.equal(dump.input_ids, torch.tensor(sent_ids, dtype=torch.int64)):
        raise DumpError(
            ErrorReason.TOKEN_MISMATCH,
            f"dump {dump.rid} holds {dump.input_ids.shape[0]} token ids that differ from the {tokens} sent "
            "(a cached prefix, a stale dump, or rows of another request)",
        )
    if dump.storage_dtype != expect.storage:
        raise StorageMismatchError(
            ErrorReason.DTYPE_MISMATCH,
            f"dump {dump.rid} is stored as {dump.storage_dtype or dump.model_dtype} but this output stores "
            f"{expect.storage or 'the model dtype'}: the server is configured for the other storage. Restart it with the "
            "output's storage (SGLang hook config storage), or extract into a new --output",
        )
    if dump.is_fp8:
        _check_fp8(dump, tokens, expect, values)
        return
    if dump.is_stacked:
        _check_stacked(dump, tokens, expect, values)
        return
    aux, final = dump.plain_states("the dump checks")
    num_aux = len(expect.aux_layer_ids)
    want_aux = (tokens, num_aux, expect.hidden_size)
    if tuple(aux.shape) != want_aux:
        raise DumpError(
            ErrorReason.SHAPE_MISMATCH,
            f"dump {dump.rid} aux_hidden_states is {tuple(aux.shape)}, expected {want_aux}",
        )
    want_final = (tokens, expect.hidden_size)
    if tuple(final.shape) != want_final:
        got = tuple(final.shape)
        raise DumpError(ErrorReason.SHAPE_MISMATCH, f"dump {dump.rid} final_hidden_state is {got}, expected {want_final}")
    tensors = [aux, final]
    if expect.need_final_prenorm:
        prenorm = dump.final_prenorm_hidden_state
        if prenorm is None or tuple(prenorm.shape) != (tokens, expect.hidden_size):
            raise DumpError(
                ErrorReason.MISSING_FINAL_PRENORM,
                f"dump {dump.rid} has no [T, H] final_prenorm_hidden_state, which the output format needs",
            )
        tensors.append(prenorm)
    for tensor in tensors:
        dtype = str(tensor.dtype).removeprefix("torch.")
        if expect.dtype is not None and dtype != expect.dtype:
            raise DumpError(ErrorReason.DTYPE_MISMATCH, f"dump {dump.rid} holds {dtype} tensors, expected {expect.dtype}")
        if values and not all_finite(tensor):
            raise DumpError(ErrorReason.NON_FINITE, f"dump {dump.rid} holds NaN or infinite values")


def _check_stacked(dump: Dump, tokens: int, expect: DumpExpectation, values: bool) -> None:
    """A dump stacked in the model's dtype: [T, K+1, H] of the output's dtype, its last slot the final state the
    format needs."""
    states = dump.hidden_states
    assert states is not None  # is_stacked
    want = (tokens, len(expect.aux_layer_ids) + 1, expect.hidden_size)
    if tuple(states.shape) != want:
        raise DumpError(ErrorReason.SHAPE_MISMATCH, f"dump {dump.rid} hidden_states is {tuple(states.shape)}, expected {want}")
    dtype = str(states.dtype).removeprefix("torch.")
    if expect.dtype is not None and dtype != expect.dtype:
        raise DumpError(ErrorReason.DTYPE_MISMATCH, f"dump {dump.rid} holds {dtype} tensors, expected {expect.dtype}")
    _check_final_slot(dump, expect)
    if values and not all_finite(states):
        raise DumpError(ErrorReason.NON_FINITE, f"dump {dump.rid} holds NaN or infinite values")


def _check_final_slot(dump: Dump, expect: DumpExpectation) -> None:
    """The last slot of a stacked dump holds the final state the output format needs."""
    if expect.need_final_prenorm and dump.meta.final_slot != FINAL_SLOT_PRENORM:
        raise DumpError(
            ErrorReason.MISSING_FINAL_PRENORM,
            f"dump {dump.rid} holds the {dump.meta.final_slot} final state in its last slot; the output format needs "
            "the pre-norm one",
        )
    if not expect.need_final_prenorm and dump.meta.final_slot == FINAL_SLOT_PRENORM and not dump.is_fp8:
        # only a request that asked for the pre-norm state is dumped so, which this run's requests do not
        raise DumpError(ErrorReason.MISSING_FINAL_POSTNORM, postnorm_missing(dump.rid, "this output format"))


def _check_fp8(dump: Dump, tokens: int, expect: DumpExpectation, values: bool) -> None:
    """An FP8 dump: [T, K+1, H] float8_e4m3fn, [T, 1, 1] float32 scales finite and positive, the computed
    dtype the output's, the pre-norm final state in the last slot when the format needs it."""
    states, scales = dump.hidden_states, dump.hidden_states_scales
    assert states is not None and scales is not None  # Dump holds one layout or the other
    want = (tokens, len(expect.aux_layer_ids) + 1, expect.hidden_size)
    if tuple(states.shape) != want or states.dtype != fp8.FP8_DTYPE:
        raise DumpError(
            ErrorReason.SHAPE_MISMATCH,
            f"dump {dump.rid} hidden_states is {states.dtype} {tuple(states.shape)}, expected {fp8.FP8_STORAGE} {want}",
        )
    if tuple(scales.shape) != (tokens, 1, 1) or scales.dtype != torch.float32:
        raise DumpError(
            ErrorReason.SHAPE_MISMATCH,
            f"dump {dump.rid} hidden_states_scales is {scales.dtype} {tuple(scales.shape)}, expected float32 {(tokens, 1, 1)}",
        )
    if expect.dtype is not None and dump.meta.dtype != expect.dtype:
        raise DumpError(
            ErrorReason.DTYPE_MISMATCH, f"dump {dump.rid} was computed in {dump.meta.dtype}, expected {expect.dtype}"
        )
    _check_final_slot(dump, expect)
    if not all_finite(scales) or not bool((scales > 0).all()):
        raise DumpError(ErrorReason.NON_FINITE, f"dump {dump.rid} holds scales that are not finite and positive")
    if values and not all_finite(states):
        raise DumpError(ErrorReason.NON_FINITE, f"dump {dump.rid} holds NaN FP8 values")
