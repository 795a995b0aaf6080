"""The dump contract between a server and the extractor (docs/design-notes.md, "The dump contract").

One directory per request under the dump root, named by its rid::

    <root>/<rid>/hidden.safetensors   input_ids [T] int64, aux_hidden_states [T,K,H], final_hidden_state [T,H]
                                      (post-norm), optionally final_prenorm_hidden_state [T,H] (the last
                                      layer's output before the final norm, for trainers that want it)
    <root>/<rid>/meta.json            :class:`DumpMeta`: rid, tokens, shapes, dtype, and the writer's
                                      :class:`DumpSource` (engine, model, layer ids, capture indices, ...)
    <root>/<rid>/done                 empty; written last. No reader touches a directory without it.
    <root>/<rid>/error                instead of ``done`` when the writer failed; holds the reason.

Every file is written under a temporary name and moved into place with ``os.replace``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from hsextract import __version__
from hsextract.contract.atomic import atomic_write_bytes, temp_path
from hsextract.contract.rids import parse_rid
from hsextract.contract.states import DumpState
from hsextract.contract.tensor_file import write_safetensors
from hsextract.errors import DumpError

HIDDEN_FILE = "hidden.safetensors"
META_FILE = "meta.json"
DONE_FILE = "done"
ERROR_FILE = "error"
DUMP_FORMAT_VERSION = 1


@dataclass(frozen=True)
class DumpSource:
    """Who writes the dumps: the same for every dump of one server process (the hook or the
    embedded engine). ``layer_ids`` and ``capture_indices`` are None when the hook is not told."""

    engine: str  # "sglang" or "hsextract-embedded"
    engine_version: str
    model_path: str
    layer_ids: list[int] | None  # aux, 0-based layer outputs
    capture_indices: list[int] | None  # the same states as SGLang's layers_to_capture (id + 1)
    final_layer_id: int | None = None  # N-1 when known
    final_norm_applied: bool = True  # final_hidden_state is after the model's final norm
    provides_final_prenorm: bool = False  # dumps also hold final_prenorm_hidden_state
    writer_rank: int = 0
    hsextract_version: str = __version__


@dataclass(frozen=True)
class DumpMeta:
    """``meta.json`` of one dump: what the tensors are, and the source that wrote them.
    On disk the source's fields sit beside the dump's own (one flat JSON object)."""

    rid: str
    num_tokens: int
    num_aux_layers: int
    hidden_size: int
    dtype: str  # "bfloat16", "float32", ...
    has_final_prenorm: bool
    extend_passes: int  # how many extend (chunked prefill) passes the rows arrived in
    written_at: float
    source: DumpSource
    dump_format_version: int = DUMP_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source"}
        return {**own, **dataclasses.asdict(self.source)}

    @classmethod
    def from_json(cls, data: Any, where: Path) -> DumpMeta:
        """Parse ``meta.json``; DumpError ``dump_malformed`` names the missing or wrong keys."""
        if not isinstance(data, dict):
            raise DumpError("dump_malformed", f"{where} is not a JSON object")
        source_fields = {f.name for f in dataclasses.fields(DumpSource)}
        own_fields = {f.name for f in dataclasses.fields(cls)} - {"source"}
        try:
            source = DumpSource(**{k: v for k, v in data.items() if k in source_fields})
            return cls(source=source, **{k: v for k, v in data.items() if k in own_fields})
        except TypeError as exc:
            raise DumpError("dump_malformed", f"{where} does not hold a dump's metadata: {exc}") from None


@dataclass
class Dump:
    """A complete dump read back from disk."""

    rid: str
    input_ids: torch.Tensor  # [T] int64
    aux_hidden_states: torch.Tensor  # [T, K, H]
    final_hidden_state: torch.Tensor  # [T, H], post-norm
    meta: DumpMeta
    final_prenorm_hidden_state: torch.Tensor | None = None  # [T, H], before the final norm


def dump_path(root: Path, rid: str) -> Path:
    """The directory of ``rid`` under ``root``; refuses anything that could escape the root."""
    if parse_rid(rid, rid.split("-", 1)[0]) is None:
        raise DumpError("bad_rid", f"rid {rid!r} is not of the form <prefix>-<9 digits>-n<tokens>")
    return root / rid


def write_dump(
    root: Path,
    rid: str,
    input_ids: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    final_hidden_state: torch.Tensor,
    source: DumpSource,
    final_prenorm_hidden_state: torch.Tensor | None = None,
    extend_passes: int = 1,
) -> Path:
    """Write one complete dump. Idempotent: an existing complete dump is left as it is."""
    directory = dump_path(root, rid)
    if (directory / DONE_FILE).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ERROR_FILE).unlink(missing_ok=True)
    tensors = {
        "input_ids": input_ids.to(torch.int64),
        "aux_hidden_states": aux_hidden_states,
        "final_hidden_state": final_hidden_state,
    }
    if final_prenorm_hidden_state is not None:
        tensors["final_prenorm_hidden_state"] = final_prenorm_hidden_state
    hidden = directory / HIDDEN_FILE
    tmp = temp_path(hidden)
    # Straight from the (pinned) host rows: no staging copy, the interpreter lock released while writing.
    write_safetensors(tmp, tensors, metadata={"rid": rid, "format_version": str(DUMP_FORMAT_VERSION)})
    os.replace(tmp, hidden)
    meta = DumpMeta(
        rid=rid,
        num_tokens=int(input_ids.shape[0]),
        num_aux_layers=int(aux_hidden_states.shape[1]),
        hidden_size=int(final_hidden_state.shape[-1]),
        dtype=str(final_hidden_state.dtype).removeprefix("torch."),
        has_final_prenorm=final_prenorm_hidden_state is not None,
        extend_passes=extend_passes,
        written_at=time.time(),
        source=source,
    )
    atomic_write_bytes(directory / META_FILE, json.dumps(meta.to_json(), indent=1).encode())
    atomic_write_bytes(directory / DONE_FILE, b"")
    return directory


def write_error_marker(root: Path, rid: str, reason: str) -> None:
    """Leave an ``error`` marker so the extractor reports the failure and retries the request."""
    directory = dump_path(root, rid)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / ERROR_FILE, reason.encode())


def dump_state(directory: Path) -> DumpState:
    if (directory / DONE_FILE).exists():
        return DumpState.DONE
    if (directory / ERROR_FILE).exists():
        return DumpState.ERROR
    return DumpState.PENDING


def read_error(directory: Path) -> str:
    try:
        return (directory / ERROR_FILE).read_text(errors="replace").strip() or "unknown error"
    except FileNotFoundError:
        return "error marker vanished"


def read_dump(directory: Path) -> Dump:
    """Read a complete dump. Raises DumpError when it is not complete or malformed."""
    if not (directory / DONE_FILE).exists():
        raise DumpError("dump_incomplete", f"dump {directory} has no '{DONE_FILE}' sentinel")
    try:
        meta = DumpMeta.from_json(json.loads((directory / META_FILE).read_text()), directory / META_FILE)
        with safe_open(str(directory / HIDDEN_FILE), framework="pt") as handle:
            names = set(handle.keys())
            missing = {"input_ids", "aux_hidden_states", "final_hidden_state"} - names
            if missing:
                raise DumpError("dump_malformed", f"dump {directory} lacks tensors {sorted(missing)}")
            tensors = {name: handle.get_tensor(name) for name in names}
    except (OSError, ValueError, SafetensorError) as exc:  # JSONDecodeError is a ValueError
        raise DumpError("dump_unreadable", f"dump {directory} cannot be read: {exc}") from exc
    return Dump(
        rid=directory.name,
        input_ids=tensors["input_ids"],
        aux_hidden_states=tensors["aux_hidden_states"],
        final_hidden_state=tensors["final_hidden_state"],
        meta=meta,
        final_prenorm_hidden_state=tensors.get("final_prenorm_hidden_state"),
    )


def remove_dump(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
