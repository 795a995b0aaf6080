"""Write host tensors to a safetensors file straight from their memory.

The format (an 8-byte little-endian header length, a JSON header of dtype, shape and byte
offsets padded to 8 bytes, then the raw bytes) is simple enough to write with ``os.writev`` from
views of the tensors themselves: no intermediate copy, and the interpreter lock is released for
every byte written, so several dump-writer threads really write in parallel. Files read back
with ``safetensors.safe_open`` like any other.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
}
_MAX_WRITE = 1 << 30  # bytes per writev call; Linux caps one call at about 2 GiB anyway


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    if tensor.device.type != "cpu":
        raise ValueError(f"tensor on {tensor.device}: copy it to the host before writing")
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    view: memoryview = flat.view(torch.uint8).numpy().data
    return view.cast("B")


def safetensors_header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for ``tensors`` laid out in the given order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name} has dtype {tensor.dtype}, which safetensors does not store")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


#: the order safetensors' save_file (0.8) lays dtypes out in, first to last (its Dtype enum's, reversed)
_LIBRARY_ORDER = ("I64", "F64", "F32", "I32", "BF16", "F16", "I16", "F8_E4M3", "I8", "U8", "BOOL")


def in_library_order(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` in the order ``safetensors.torch.save_file`` lays them out (by dtype, then by name), so a file
    written from them holds its bytes exactly."""
    return dict(sorted(tensors.items(), key=lambda item: (_LIBRARY_ORDER.index(_DTYPES[item[1].dtype]), item[0])))


def safetensors_pieces(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> list[memoryview]:
    """The file's bytes in order, without a copy: the length prefix and header, then each tensor's memory."""
    views = [_bytes_of(t) for t in tensors.values()]
    return [memoryview(safetensors_header(tensors, metadata)), *(v for v in views if v.nbytes)]


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> int:
    """Write ``tensors`` (host, any layout) to ``path``; returns the file's size in bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return write_safetensors_to(fd, tensors, metadata)
    finally:
        os.close(fd)


def write_safetensors_to(fd: int, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> int:
    """:func:`write_safetensors` to a file open for writing (at its offset, left open); returns the bytes written."""
    pending = safetensors_pieces(tensors, metadata)
    total = sum(v.nbytes for v in pending)
    # Sized first: a tmpfs mounted huge=within_size backs with huge pages only what lies within a file's size, and a
    # file that grows write by write gets small ones on kernels that look at the size alone (dump_pages.py)
    os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR) + total)
    while pending:
        batch, room = [], _MAX_WRITE
        for view in pending:
            if room <= 0:
                break
            batch.append(view[:room])
            room -= min(room, view.nbytes)
        written = os.writev(fd, batch)
        while written:  # drop what was written, keep the rest (writev may write less than asked)
            head = pending[0]
            if written >= head.nbytes:
                written -= head.nbytes
                pending.pop(0)
            else:
                pending[0] = head[written:]
                written = 0
    return total
