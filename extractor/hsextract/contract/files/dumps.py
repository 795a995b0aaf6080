"""The dump contract between a server and the extractor (docs/design-notes.md, "The dump contract").

One directory per request under the dump root, named by its rid::

    <root>/<rid>/hidden.safetensors   input_ids [T] int64, aux_hidden_states [T,K,H], final_hidden_state [T,H]
                                      (post-norm), optionally final_prenorm_hidden_state [T,H] (the last
                                      layer's output before the final norm, for trainers that want it)
    or, stacked in the model's dtype (the embedded server's, for a request that asks for the pre-norm final
    state; meta ``final_slot`` set, no ``storage_dtype``):
    <root>/<rid>/hidden.safetensors   input_ids [T] int64, hidden_states [T,K+1,H] (the K aux states in layer
                                      order, then the final state ``final_slot`` names): speculators' sample
                                      layout, written and read without a copy to stack it, and without the
                                      final state the request did not ask for (issue 37)
    or, for a request dumped as FP8 (``contract.fp8``, speculators' own layout; meta ``storage_dtype``
    ``"float8_e4m3fn"``):
    <root>/<rid>/hidden.safetensors   input_ids [T] int64, hidden_states [T,K+1,H] float8_e4m3fn (the K aux
                                      states in layer order, then the final state: pre-norm when meta
                                      ``final_slot`` is ``"prenorm"``, else post-norm), hidden_states_scales
                                      [T,1,1] float32 (one scale per token, hs-connectors' arithmetic)
    <root>/<rid>/meta.json            :class:`DumpMeta`: rid, tokens, shapes, dtype, and the writer's
                                      :class:`DumpSource` (engine, model, layer ids, capture indices, ...)
    <root>/<rid>/done                 empty; written last. No reader touches a directory without it.
    <root>/<rid>/error                instead of ``done`` when the writer failed; holds the reason.

Every file is written under a temporary name and moved into place with ``os.replace``. Nothing
here follows a symlink: directories and files are opened with ``O_NOFOLLOW`` relative to directory
descriptors (``dump_dir.py``), so a link planted under a request id is never written through or read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import orjson
import torch
from safetensors import SafetensorError, safe_open

from hsextract.contract.files.dump_dir import (
    DIR_FLAGS,
    fd_path,
    is_regular_file,
    open_file,
    open_request_dir,
    prepare_dump_root,
    read_whole,
    request_dir_exists,
)
from hsextract.contract.files.dump_types import (  # re-exported: the dump contract's one import
    DUMP_FORMAT_VERSION,
    FINAL_SLOT_POSTNORM,
    FINAL_SLOT_PRENORM,
    FP8_TENSORS,
    PLAIN_TENSORS,
    STACKED_TENSORS,
    Dump,
    DumpMeta,
    DumpSource,
    postnorm_missing,
)
from hsextract.contract.files.fp8 import FP8_DTYPE, FP8_STORAGE
from hsextract.contract.files.tensor_file import Stacked, write_safetensors_to
from hsextract.contract.rids import parse_rid
from hsextract.contract.states import DumpState, ErrorReason
from hsextract.durable.atomic import temp_name
from hsextract.errors import DumpError

__all__ = [
    "DONE_FILE",
    "DUMP_FILES",
    "DUMP_FORMAT_VERSION",
    "ERROR_FILE",
    "FINAL_SLOT_POSTNORM",
    "FINAL_SLOT_PRENORM",
    "FP8_TENSORS",
    "HIDDEN_FILE",
    "META_FILE",
    "PLAIN_TENSORS",
    "STACKED_TENSORS",
    "Dump",
    "DumpMeta",
    "DumpSource",
    "dump_path",
    "dump_state",
    "postnorm_missing",
    "read_dump",
    "read_error",
    "remove_dump",
    "write_dump",
    "write_error_marker",
    "write_fp8_dump",
    "write_stacked_dump",
]

HIDDEN_FILE = "hidden.safetensors"
META_FILE = "meta.json"
DONE_FILE = "done"
ERROR_FILE = "error"
#: what a request directory holds, the marker first: a reader never finds ``done`` without the files
DUMP_FILES = (DONE_FILE, ERROR_FILE, META_FILE, HIDDEN_FILE)
def dump_path(root: Path, rid: str) -> Path:
    """The directory of ``rid`` under ``root``; refuses anything that could escape the root."""
    if parse_rid(rid, rid.split("-", 1)[0]) is None:
        raise DumpError(ErrorReason.BAD_RID, f"rid {rid!r} is not of the form <prefix>-<9 digits>-n<tokens>")
    return root / rid


def _replace_at(dir_fd: int, name: str, write: Callable[[int], object]) -> None:
    """Write ``name`` in the directory ``dir_fd`` under a temp name, then rename it into place. The temp file is
    created fresh (never through a symlink), written through the descriptor that created it (each call lets
    another of the server's threads run: four calls a file) and removed if the write fails."""
    tmp = temp_name(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:  # a leftover of this pid and thread: ours
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            write(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a symlink itself, never its target
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _write_bytes_at(dir_fd: int, name: str, data: bytes) -> None:
    def write(fd: int) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    _replace_at(dir_fd, name, write)


def _open_for_writing(root: Path, rid: str) -> tuple[Path, int]:
    directory = dump_path(root, rid)
    if not os.path.lexists(root):
        prepare_dump_root(root)  # normally done once by DumpSink; a direct caller gets the same checks
    fd = open_request_dir(directory, create=True)
    assert fd is not None  # create=True makes it or raises
    return directory, fd


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
    """Write one complete dump in the model's dtype. Idempotent: an existing complete dump is left as it is."""
    tensors = {
        "input_ids": input_ids.to(torch.int64),
        "aux_hidden_states": aux_hidden_states,
        "final_hidden_state": final_hidden_state,
    }
    if final_prenorm_hidden_state is not None:
        tensors["final_prenorm_hidden_state"] = final_prenorm_hidden_state

    prenorm = final_prenorm_hidden_state is not None
    meta = _model_dtype_meta(rid, input_ids, aux_hidden_states, final_hidden_state, source, extend_passes, None, prenorm)
    return _write_complete(root, rid, tensors, meta)


def write_stacked_dump(
    root: Path,
    rid: str,
    input_ids: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    final_state: torch.Tensor,
    source: DumpSource,
    *,
    final_slot: str,
    extend_passes: int = 1,
) -> Path:
    """Write one complete dump stacked in the model's dtype: ``hidden_states [T, K+1, H]``, the aux states ``[T, K, H]``
    then ``final_state [T, H]``, which ``final_slot`` names. Stacked as it is written, a few tokens at a time in one
    buffer (``tensor_file.Stacked``): the rows stay where the copy from the device put them. Idempotent."""
    if final_slot not in (FINAL_SLOT_PRENORM, FINAL_SLOT_POSTNORM):
        raise ValueError(f"final_slot {final_slot!r} must be {FINAL_SLOT_PRENORM!r} or {FINAL_SLOT_POSTNORM!r}")
    tensors: dict[str, torch.Tensor | Stacked] = {
        "input_ids": input_ids.to(torch.int64),
        "hidden_states": Stacked((aux_hidden_states, final_state.unsqueeze(1))),
    }
    meta = _model_dtype_meta(rid, input_ids, aux_hidden_states, final_state, source, extend_passes, final_slot)
    return _write_complete(root, rid, tensors, meta)


def _model_dtype_meta(
    rid: str,
    input_ids: torch.Tensor,
    aux: torch.Tensor,
    final: torch.Tensor,
    source: DumpSource,
    extend_passes: int,
    final_slot: str | None,
    has_final_prenorm: bool = False,
) -> Callable[[], DumpMeta]:
    """The ``meta.json`` of a model-dtype dump, made when it is written: stacked when ``final_slot`` is given."""

    def meta() -> DumpMeta:
        return DumpMeta(
            rid=rid,
            num_tokens=int(input_ids.shape[0]),
            num_aux_layers=int(aux.shape[1]),
            hidden_size=int(final.shape[-1]),
            dtype=str(final.dtype).removeprefix("torch."),
            has_final_prenorm=has_final_prenorm or final_slot == FINAL_SLOT_PRENORM,
            extend_passes=extend_passes,
            written_at=time.time(),
            source=source,
            final_slot=final_slot,
        )

    return meta


def write_fp8_dump(
    root: Path,
    rid: str,
    input_ids: torch.Tensor,
    hidden_states: torch.Tensor,
    hidden_states_scales: torch.Tensor,
    source: DumpSource,
    *,
    model_dtype: str,
    final_slot: str,
    extend_passes: int = 1,
) -> Path:
    """Write one complete FP8 dump: ``hidden_states [T, K+1, H]`` float8_e4m3fn and its
    ``hidden_states_scales [T, 1, 1]`` float32 (``contract.fp8``). ``final_slot`` names the state in
    the last slot; ``model_dtype`` the dtype the model computed in. Idempotent."""
    if hidden_states.dtype != FP8_DTYPE or hidden_states.dim() != 3:
        raise ValueError(
            f"hidden_states must be [T, K+1, H] {FP8_STORAGE}; got {hidden_states.dtype} {tuple(hidden_states.shape)}"
        )
    if hidden_states_scales.dtype != torch.float32 or tuple(hidden_states_scales.shape) != (hidden_states.shape[0], 1, 1):
        raise ValueError(
            f"hidden_states_scales must be [T, 1, 1] float32 with T={hidden_states.shape[0]}; "
            f"got {hidden_states_scales.dtype} {tuple(hidden_states_scales.shape)}"
        )
    if final_slot not in (FINAL_SLOT_PRENORM, FINAL_SLOT_POSTNORM):
        raise ValueError(f"final_slot {final_slot!r} must be {FINAL_SLOT_PRENORM!r} or {FINAL_SLOT_POSTNORM!r}")
    tensors = {
        "input_ids": input_ids.to(torch.int64),
        "hidden_states": hidden_states,
        "hidden_states_scales": hidden_states_scales,
    }

    def meta() -> DumpMeta:
        return DumpMeta(
            rid=rid,
            num_tokens=int(input_ids.shape[0]),
            num_aux_layers=int(hidden_states.shape[1]) - 1,
            hidden_size=int(hidden_states.shape[-1]),
            dtype=model_dtype,
            has_final_prenorm=final_slot == FINAL_SLOT_PRENORM,
            extend_passes=extend_passes,
            written_at=time.time(),
            source=source,
            storage_dtype=FP8_STORAGE,
            final_slot=final_slot,
        )

    return _write_complete(root, rid, tensors, meta)


def _write_complete(root: Path, rid: str, tensors: Mapping[str, torch.Tensor | Stacked], meta: Callable[[], DumpMeta]) -> Path:
    directory, dir_fd = _open_for_writing(root, rid)
    try:
        if is_regular_file(dir_fd, DONE_FILE):
            return directory
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ERROR_FILE, dir_fd=dir_fd)
        metadata = {"rid": rid, "format_version": str(DUMP_FORMAT_VERSION)}
        # Straight from the (pinned) host rows: no staging copy, the interpreter lock released while writing.
        _replace_at(dir_fd, HIDDEN_FILE, lambda fd: write_safetensors_to(fd, tensors, metadata=metadata))
        _write_bytes_at(dir_fd, META_FILE, orjson.dumps(meta().to_json(), option=orjson.OPT_INDENT_2))
        _write_bytes_at(dir_fd, DONE_FILE, b"")
    finally:
        os.close(dir_fd)
    return directory


def write_error_marker(root: Path, rid: str, reason: str) -> None:
    """Leave an ``error`` marker so the extractor reports the failure and retries the request."""
    _, dir_fd = _open_for_writing(root, rid)
    try:
        _write_bytes_at(dir_fd, ERROR_FILE, reason.encode())
    finally:
        os.close(dir_fd)


def dump_state(directory: Path) -> DumpState:
    """``done``, ``error`` or ``pending``; DumpError ``unsafe_dump`` when a symlink or file stands in the request
    directory's place. A row's worker asks while its request is open, so this costs one to three ``lstat``: the
    trust checks of what is inside (owner, mode, no symlinked files) are :func:`read_dump`'s and
    :func:`read_error`'s, which open it."""
    if not request_dir_exists(directory):
        return DumpState.PENDING
    prefix = f"{directory}{os.sep}"
    for name, state in ((DONE_FILE, DumpState.DONE), (ERROR_FILE, DumpState.ERROR)):
        try:
            os.lstat(prefix + name)
        except FileNotFoundError:
            continue
        return state
    return DumpState.PENDING


def read_error(directory: Path) -> str:
    try:
        dir_fd = open_request_dir(directory)
        if dir_fd is None:
            return "error marker vanished"
        try:
            fd = open_file(dir_fd, ERROR_FILE, directory)
            if fd is None:
                return "error marker vanished"
            with os.fdopen(fd, "rb") as handle:
                return handle.read(4096).decode(errors="replace").strip() or "unknown error"
        finally:
            os.close(dir_fd)
    except DumpError as exc:
        return str(exc)


def read_dump(directory: Path) -> Dump:
    """Read a complete dump, never through a symlink. Raises DumpError when it is not complete,
    malformed, or not a real directory and files (``unsafe_dump``)."""
    dir_fd = open_request_dir(directory)
    if dir_fd is None:
        raise DumpError(ErrorReason.DUMP_INCOMPLETE, f"dump {directory} does not exist")
    try:
        done = open_file(dir_fd, DONE_FILE, directory)
        if done is None:
            raise DumpError(ErrorReason.DUMP_INCOMPLETE, f"dump {directory} has no '{DONE_FILE}' sentinel")
        try:
            completed = os.fstat(done).st_mtime
        finally:
            os.close(done)
        try:
            meta_fd = open_file(dir_fd, META_FILE, directory)
            hidden_fd = open_file(dir_fd, HIDDEN_FILE, directory)
            try:
                if meta_fd is None or hidden_fd is None:
                    raise DumpError(ErrorReason.DUMP_MALFORMED, f"dump {directory} is marked done but lacks its files")
                meta = DumpMeta.from_json(json.loads(read_whole(meta_fd)), directory / META_FILE)
                with safe_open(fd_path(hidden_fd), framework="pt") as tensors_file:
                    names = set(tensors_file.keys())
                    missing = set(_layout_tensors(meta)) - names
                    if meta.storage_dtype not in (None, FP8_STORAGE):
                        raise DumpError(
                            ErrorReason.DUMP_MALFORMED,
                            f"dump {directory} has storage_dtype {meta.storage_dtype!r}; this reader knows {FP8_STORAGE!r}",
                        )
                    if missing:
                        raise DumpError(ErrorReason.DUMP_MALFORMED, f"dump {directory} lacks tensors {sorted(missing)}")
                    tensors = {name: tensors_file.get_tensor(name) for name in names}
            finally:
                for fd in (meta_fd, hidden_fd):
                    if fd is not None:
                        os.close(fd)
        except (OSError, ValueError, SafetensorError) as exc:  # JSONDecodeError is a ValueError
            raise DumpError(ErrorReason.DUMP_UNREADABLE, f"dump {directory} cannot be read: {exc}") from exc
    finally:
        os.close(dir_fd)
    if meta.rid != directory.name:
        raise DumpError(ErrorReason.DUMP_MALFORMED, f"dump {directory} holds the metadata of {meta.rid!r}")
    if meta.storage_dtype is None and meta.final_slot is not None:
        return Dump.stacked(directory.name, tensors["input_ids"], meta, tensors["hidden_states"], completed)
    if meta.storage_dtype is not None:
        return Dump(
            rid=directory.name,
            input_ids=tensors["input_ids"],
            meta=meta,
            hidden_states=tensors["hidden_states"],
            hidden_states_scales=tensors["hidden_states_scales"],
            storage_dtype=meta.storage_dtype,
            completed_at=completed,
        )
    return Dump(
        rid=directory.name,
        input_ids=tensors["input_ids"],
        meta=meta,
        aux_hidden_states=tensors["aux_hidden_states"],
        final_hidden_state=tensors["final_hidden_state"],
        final_prenorm_hidden_state=tensors.get("final_prenorm_hidden_state"),
        completed_at=completed,
    )


def _layout_tensors(meta: DumpMeta) -> tuple[str, ...]:
    """The tensors a dump of this metadata holds."""
    if meta.storage_dtype is not None:
        return FP8_TENSORS
    return PLAIN_TENSORS if meta.final_slot is None else STACKED_TENSORS


def remove_dump(directory: Path) -> None:
    """Remove a request's directory; a symlink or file in its place is unlinked, never followed. A dump's own
    files go by name (a few calls, each of which lets another of the extractor's threads run), anything else
    inside (a writer's temp file) through ``shutil.rmtree``."""
    try:
        dir_fd = os.open(directory, DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError:  # a symlink (ELOOP) or a file (ENOTDIR) in its place
        with contextlib.suppress(OSError):
            os.unlink(directory)
        return
    try:
        for name in DUMP_FILES:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError:  # not empty
        shutil.rmtree(directory, ignore_errors=True)  # fd-based on Linux: links inside are not followed
