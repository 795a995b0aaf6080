"""The dump contract between a server and the extractor (DESIGN section 4).

One directory per request under the dump root, named by its rid::

    <root>/<rid>/hidden.safetensors   input_ids [T] int64, aux_hidden_states [T,K,H], final_hidden_state [T,H]
                                      (post-norm), optionally final_prenorm_hidden_state [T,H] (the last
                                      layer's output before the final norm, for trainers that want it)
    <root>/<rid>/meta.json            rid, num_tokens, hidden_size, dtype, capture indices, layer ids, ...
    <root>/<rid>/done                 empty; written last. No reader touches a directory without it.
    <root>/<rid>/error                instead of ``done`` when the writer failed; holds the reason.

Every file is written under a temporary name and moved into place with ``os.replace``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hsextract.contract.atomic import atomic_write_bytes, temp_path
from hsextract.contract.rids import parse_rid
from hsextract.errors import DumpError

HIDDEN_FILE = "hidden.safetensors"
META_FILE = "meta.json"
DONE_FILE = "done"
ERROR_FILE = "error"
DUMP_FORMAT_VERSION = 1


@dataclass
class Dump:
    """A complete dump read back from disk."""

    rid: str
    input_ids: torch.Tensor  # [T] int64
    aux_hidden_states: torch.Tensor  # [T, K, H]
    final_hidden_state: torch.Tensor  # [T, H], post-norm
    meta: dict[str, Any]
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
    meta: dict[str, Any],
    final_prenorm_hidden_state: torch.Tensor | None = None,
) -> Path:
    """Write one complete dump. Idempotent: an existing complete dump is left as it is."""
    directory = dump_path(root, rid)
    if (directory / DONE_FILE).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ERROR_FILE).unlink(missing_ok=True)
    tensors = {
        "input_ids": input_ids.to(torch.int64).contiguous(),
        "aux_hidden_states": aux_hidden_states.contiguous(),
        "final_hidden_state": final_hidden_state.contiguous(),
    }
    if final_prenorm_hidden_state is not None:
        tensors["final_prenorm_hidden_state"] = final_prenorm_hidden_state.contiguous()
    hidden = directory / HIDDEN_FILE
    tmp = temp_path(hidden)
    save_file(tensors, str(tmp), metadata={"rid": rid, "format_version": str(DUMP_FORMAT_VERSION)})
    os.replace(tmp, hidden)
    full_meta = {
        "rid": rid,
        "num_tokens": int(input_ids.shape[0]),
        "num_aux_layers": int(aux_hidden_states.shape[1]),
        "hidden_size": int(final_hidden_state.shape[-1]),
        "dtype": str(final_hidden_state.dtype).removeprefix("torch."),
        "has_final_prenorm": final_prenorm_hidden_state is not None,
        "dump_format_version": DUMP_FORMAT_VERSION,
        "written_at": time.time(),
        **meta,
    }
    atomic_write_bytes(directory / META_FILE, json.dumps(full_meta, indent=1).encode())
    atomic_write_bytes(directory / DONE_FILE, b"")
    return directory


def write_error_marker(root: Path, rid: str, reason: str) -> None:
    """Leave an ``error`` marker so the extractor reports the failure and retries the request."""
    directory = dump_path(root, rid)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / ERROR_FILE, reason.encode())


def dump_state(directory: Path) -> str:
    """``done``, ``error`` or ``pending``."""
    if (directory / DONE_FILE).exists():
        return "done"
    if (directory / ERROR_FILE).exists():
        return "error"
    return "pending"


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
        meta = json.loads((directory / META_FILE).read_text())
        with safe_open(str(directory / HIDDEN_FILE), framework="pt") as handle:
            names = set(handle.keys())
            missing = {"input_ids", "aux_hidden_states", "final_hidden_state"} - names
            if missing:
                raise DumpError("dump_malformed", f"dump {directory} lacks tensors {sorted(missing)}")
            tensors = {name: handle.get_tensor(name) for name in names}
    except (OSError, ValueError, json.JSONDecodeError) as exc:  # safetensors raises its own SafetensorError(Exception)
        raise DumpError("dump_unreadable", f"dump {directory} cannot be read: {exc}") from exc
    except Exception as exc:
        if type(exc).__name__ == "SafetensorError":
            raise DumpError("dump_unreadable", f"dump {directory} cannot be read: {exc}") from exc
        raise
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
