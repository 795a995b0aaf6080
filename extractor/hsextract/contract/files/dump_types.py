"""What a dump is, apart from its files (``dumps.py``): who wrote it (:class:`DumpSource`), its ``meta.json``
(:class:`DumpMeta`), and a complete dump as read back, in one of its three layouts (:class:`Dump`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hsextract import __version__
from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.contract.states import ErrorReason
from hsextract.errors import DumpError

DUMP_FORMAT_VERSION = 1
#: ``final_slot`` of a stacked dump (FP8, or the model's dtype): which final state its last slot holds
FINAL_SLOT_PRENORM = "prenorm"
FINAL_SLOT_POSTNORM = "postnorm"
PLAIN_TENSORS = ("input_ids", "aux_hidden_states", "final_hidden_state")
STACKED_TENSORS = ("input_ids", "hidden_states")
FP8_TENSORS = ("input_ids", "hidden_states", "hidden_states_scales")


@dataclass(frozen=True)
class DumpSource:
    """Who writes the dumps: the same for every dump of one server process (the hook or the
    embedded engine). ``layer_ids`` and ``capture_indices`` are None when the hook is not told."""

    engine: str  # "sglang" or "hsextract-embedded"
    engine_version: str
    model_path: str  # absolute, as the server resolved it
    layer_ids: list[int] | None  # aux, 0-based layer outputs
    capture_indices: list[int] | None  # the same states as SGLang's layers_to_capture (id + 1)
    final_layer_id: int | None = None  # N-1 when known
    final_norm_applied: bool = True  # final_hidden_state is after the model's final norm
    provides_final_prenorm: bool = False  # dumps also hold final_prenorm_hidden_state
    writer_rank: int = 0
    hsextract_version: str = __version__
    model_fingerprint: str | None = None  # contract.model_fingerprint of model_path, when readable


@dataclass(frozen=True)
class DumpMeta:
    """``meta.json`` of one dump: what the tensors are, and the source that wrote them.
    On disk the source's fields sit beside the dump's own (one flat JSON object)."""

    rid: str
    num_tokens: int
    num_aux_layers: int
    hidden_size: int
    dtype: str  # the model's dtype: "bfloat16", "float32", ... (of the tensors, unless storage_dtype says otherwise)
    has_final_prenorm: bool  # the dump holds the pre-norm final state (FP8: in its last slot)
    extend_passes: int  # how many extend (chunked prefill) passes the rows arrived in
    written_at: float
    source: DumpSource
    dump_format_version: int = DUMP_FORMAT_VERSION
    # FP8 dumps only (absent from meta.json otherwise): "float8_e4m3fn"
    storage_dtype: str | None = None
    # stacked dumps only (FP8, or stacked in the model's dtype): which final state the last slot of hidden_states
    # holds, FINAL_SLOT_PRENORM or FINAL_SLOT_POSTNORM
    final_slot: str | None = None

    def to_json(self) -> dict[str, Any]:
        # the field names once per process (_OWN_FIELDS), not dataclasses.fields/asdict per dump: the server writes
        # hundreds of dumps a second under one interpreter lock
        own = {name: getattr(self, name) for name in _OWN_FIELDS}
        for optional in ("storage_dtype", "final_slot"):  # the model-dtype layout's meta.json stays as it was
            if own[optional] is None:
                del own[optional]
        source = self.source
        return {**own, **{name: _copied(getattr(source, name)) for name in _SOURCE_FIELDS}}

    @classmethod
    def from_json(cls, data: Any, where: Path) -> DumpMeta:
        """Parse ``meta.json``; DumpError ``dump_malformed`` names the missing or wrong keys."""
        if not isinstance(data, dict):
            raise DumpError(ErrorReason.DUMP_MALFORMED, f"{where} is not a JSON object")
        try:
            source = DumpSource(**{k: v for k, v in data.items() if k in _SOURCE_FIELDS})
            return cls(source=source, **{k: v for k, v in data.items() if k in _OWN_FIELDS})
        except TypeError as exc:
            raise DumpError(ErrorReason.DUMP_MALFORMED, f"{where} does not hold a dump's metadata: {exc}") from None


_SOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(DumpSource))
_OWN_FIELDS = tuple(f.name for f in dataclasses.fields(DumpMeta) if f.name != "source")


def _copied(value: Any) -> Any:
    """A source field as ``dataclasses.asdict`` gives it: its lists copied."""
    return list(value) if isinstance(value, list) else value


@dataclass
class Dump:
    """A complete dump read back from disk, in one of three layouts (meta ``storage_dtype`` and ``final_slot``):

    * the model's dtype (neither): ``aux_hidden_states``, ``final_hidden_state`` and, when asked for,
      ``final_prenorm_hidden_state``; the stacked fields are None;
    * stacked in the model's dtype (``final_slot`` alone): ``hidden_states [T, K+1, H]``, with
      ``aux_hidden_states`` and the final state its slot names (``final_prenorm_hidden_state`` or
      ``final_hidden_state``) set as views of it, the other final None;
    * FP8 (``storage_dtype == "float8_e4m3fn"``): ``hidden_states`` and ``hidden_states_scales``; the
      three model-dtype fields are None (:meth:`plain_states` says so with a DumpError).
    """

    rid: str
    input_ids: torch.Tensor  # [T] int64
    meta: DumpMeta
    aux_hidden_states: torch.Tensor | None = None  # [T, K, H]
    final_hidden_state: torch.Tensor | None = None  # [T, H], post-norm
    final_prenorm_hidden_state: torch.Tensor | None = None  # [T, H], before the final norm
    hidden_states: torch.Tensor | None = None  # [T, K+1, H]: float8_e4m3fn, or the model's dtype when stacked
    hidden_states_scales: torch.Tensor | None = None  # [T, 1, 1] float32
    storage_dtype: str | None = None  # FP8_STORAGE for an FP8 dump
    completed_at: float | None = None  # when its ``done`` marker was written (time.time() scale), as read

    @classmethod
    def stacked(
        cls, rid: str, input_ids: torch.Tensor, meta: DumpMeta, hidden_states: torch.Tensor, completed_at: float | None = None
    ) -> Dump:
        """A dump stacked in the model's dtype, its aux and final fields views of ``hidden_states``."""
        last = hidden_states[:, -1]
        prenorm = meta.final_slot == FINAL_SLOT_PRENORM
        return cls(
            rid=rid,
            input_ids=input_ids,
            meta=meta,
            aux_hidden_states=hidden_states[:, :-1],
            final_hidden_state=None if prenorm else last,
            final_prenorm_hidden_state=last if prenorm else None,
            hidden_states=hidden_states,
            completed_at=completed_at,
        )

    def __post_init__(self) -> None:
        fp8 = (self.hidden_states, self.hidden_states_scales)
        plain = (self.aux_hidden_states, self.final_hidden_state)
        if self.storage_dtype is not None:
            ok = self.storage_dtype == FP8_STORAGE and all(t is not None for t in fp8)
            ok = ok and all(t is None for t in (*plain, self.final_prenorm_hidden_state))
        elif self.hidden_states is not None:  # stacked: the aux and the one final state are its views
            finals = (self.final_hidden_state, self.final_prenorm_hidden_state)
            ok = self.hidden_states_scales is None and self.aux_hidden_states is not None
            ok = ok and self.meta.final_slot in (FINAL_SLOT_PRENORM, FINAL_SLOT_POSTNORM)
            ok = ok and sum(t is not None for t in finals) == 1
        else:
            ok = all(t is not None for t in plain) and self.hidden_states_scales is None
        if not ok:
            raise DumpError(
                ErrorReason.DUMP_MALFORMED,
                f"dump {self.rid} mixes or lacks layouts (storage_dtype {self.storage_dtype!r}, final_slot "
                f"{self.meta.final_slot!r}): a model-dtype dump holds {list(PLAIN_TENSORS)}, a stacked one "
                f"{list(STACKED_TENSORS)} and meta final_slot, an FP8 dump {list(FP8_TENSORS)}",
            )

    @property
    def is_fp8(self) -> bool:
        return self.storage_dtype is not None

    @property
    def is_stacked(self) -> bool:
        """Stacked in the model's dtype: ``hidden_states [T, K+1, H]`` as speculators' sample holds it."""
        return self.storage_dtype is None and self.hidden_states is not None

    @property
    def model_dtype(self) -> str:
        """The dtype the model computed in ("bfloat16", ...), whatever the storage."""
        if self.storage_dtype is None and self.aux_hidden_states is not None:
            return str(self.aux_hidden_states.dtype).removeprefix("torch.")
        return self.meta.dtype

    def plain_states(self, reader: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux [T, K, H], final [T, H])`` of a model-dtype dump, the final state post-norm; DumpError naming
        ``reader`` (the step that cannot read it) for an FP8 dump (``dtype_mismatch``) or one stacked with the
        pre-norm final state alone (``missing_final_postnorm``)."""
        if self.aux_hidden_states is None:
            raise DumpError(
                ErrorReason.DTYPE_MISMATCH,
                f"dump {self.rid} is stored as {self.storage_dtype} (hidden_states + hidden_states_scales), which "
                f"{reader} does not read; restart the server without FP8 storage, or use a step that reads FP8 dumps",
            )
        if self.final_hidden_state is None:
            raise DumpError(ErrorReason.MISSING_FINAL_POSTNORM, postnorm_missing(self.rid, reader))
        return self.aux_hidden_states, self.final_hidden_state


def postnorm_missing(rid: str, reader: str) -> str:
    """Why a dump stacked with the pre-norm final state cannot serve ``reader``, and the fix."""
    return (
        f"dump {rid} holds the pre-norm final state alone (its request asked for it: speculators' layout), and {reader} "
        "needs the post-norm one; another client shares this server's requests, or send them without "
        "hsextract_final_prenorm"
    )
