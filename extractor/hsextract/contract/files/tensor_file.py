"""Write host tensors to a safetensors file straight from their memory.

The format (an 8-byte little-endian header length, a JSON header of dtype, shape and byte
offsets padded to 8 bytes, then the raw bytes) is simple enough to write with ``os.writev`` from
views of the tensors themselves: no intermediate copy, and the interpreter lock is released for
every byte written, so several dump-writer threads really write in parallel. Files read back
with ``safetensors.safe_open`` like any other.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from hsextract.contract.files.finite import finite_bytes

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
_MAX_BUFFERS = min(1024, os.sysconf("SC_IOV_MAX"))  # buffers per writev call (IOV_MAX: more is EINVAL)
#: bytes of a :class:`Stacked` tensor built at a time: small enough to stay in the core's cache
STACKED_PIECE_BYTES = 1 << 20


@dataclass(frozen=True)
class Stacked:
    """``torch.cat(parts, dim=1)`` of host tensors ``[T, S_i, ...]`` of one dtype, as a file holds it, never built
    whole: :func:`safetensors_stream` builds it a few tokens at a time in one reused buffer. A wide row's whole
    ``cat`` is a new tensor of tens of MB, its pages faulted in and freed each row; in the pack processes it was
    0.34-0.43 of a speculators row's samples on one H200's host (bench/results-gpu-e2e-h200-speculators.json)."""

    parts: tuple[torch.Tensor, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0]
        return (first.shape[0], sum(part.shape[1] for part in self.parts), *first.shape[2:])

    def nbytes(self) -> int:
        return math.prod(self.shape) * self.parts[0].element_size()

    def whole(self) -> torch.Tensor | None:
        """The stacked tensor itself, without a copy, when its parts are views of one laid out that way (the embedded
        server stacks the states on the device and copies them to the host in one piece: :func:`tiled`); else None."""
        return tiled(self.parts)

    def pieces(self) -> Iterator[memoryview]:
        """Its bytes in order, about :data:`STACKED_PIECE_BYTES` at a time (whole tokens, one at least); each piece
        is valid until the next is asked for (one buffer)."""
        tokens, *rest = self.shape
        token_bytes = self.nbytes() // tokens if tokens else 0
        step = max(1, STACKED_PIECE_BYTES // max(token_bytes, 1))
        buffer = torch.empty((min(step, tokens), *rest), dtype=self.dtype)
        for start in range(0, tokens, step):
            count = min(step, tokens - start)
            piece = buffer[:count]
            torch.cat([part[start : start + count] for part in self.parts], dim=1, out=piece)
            yield _bytes_of(piece)


def tiled(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.cat(parts, dim=1)`` without a copy, when the parts (``[T, S_i, ...]`` in order) are the slot ranges of
    one contiguous ``[T, sum S_i, ...]`` tensor (``base[:, :K]`` and ``base[:, K:]``); else None."""
    first = parts[0]
    tokens, rest = first.shape[0], tuple(first.shape[2:])
    inner = math.prod(rest)
    slots = sum(int(part.shape[1]) for part in parts)
    rest_strides = tuple(math.prod(rest[i + 1 :]) for i in range(len(rest)))
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for part in parts:
        same_kind = part.dtype == first.dtype and part.device == first.device and part.dim() == first.dim()
        if not same_kind or part.untyped_storage().data_ptr() != storage or part.storage_offset() != offset:
            return None
        if int(part.shape[0]) != tokens or tuple(part.shape[2:]) != rest:
            return None
        stride = part.stride()
        if (tokens > 1 and stride[0] != slots * inner) or (part.shape[1] > 1 and stride[1] != inner):
            return None
        if any(size > 1 and step != want for size, step, want in zip(rest, stride[2:], rest_strides, strict=True)):
            return None
        offset += int(part.shape[1]) * inner
    return first.as_strided((tokens, slots, *rest), (slots * inner, inner, *rest_strides), first.storage_offset())


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


AnyTensor = TypeVar("AnyTensor", bound=torch.Tensor | Stacked)


def _nbytes(tensor: torch.Tensor | Stacked) -> int:
    return tensor.nbytes() if isinstance(tensor, Stacked) else tensor.numel() * tensor.element_size()


def safetensors_header(tensors: Mapping[str, torch.Tensor | Stacked], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for ``tensors`` laid out in the given order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name} has dtype {tensor.dtype}, which safetensors does not store")
        size = _nbytes(tensor)
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


#: the order safetensors' save_file (0.8) lays dtypes out in, first to last (its Dtype enum's, reversed)
_LIBRARY_ORDER = ("I64", "F64", "F32", "I32", "BF16", "F16", "I16", "F8_E4M3", "I8", "U8", "BOOL")


def safetensors_size(tensors: Mapping[str, torch.Tensor | Stacked], metadata: Mapping[str, str] | None = None) -> int:
    """The bytes of the file :func:`safetensors_stream` writes."""
    return len(safetensors_header(tensors, metadata)) + _data_bytes(tensors)


def _data_bytes(tensors: Mapping[str, torch.Tensor | Stacked]) -> int:
    """The bytes after a safetensors file's header: every tensor's, in order."""
    return sum(_nbytes(tensor) for tensor in tensors.values())


def in_library_order(tensors: Mapping[str, AnyTensor]) -> dict[str, AnyTensor]:
    """``tensors`` in the order ``safetensors.torch.save_file`` lays them out (by dtype, then by name), so a file
    written from them holds its bytes exactly."""
    return dict(sorted(tensors.items(), key=lambda item: (_LIBRARY_ORDER.index(_DTYPES[item[1].dtype]), item[0])))


def safetensors_stream(
    tensors: Mapping[str, torch.Tensor | Stacked], metadata: Mapping[str, str] | None = None, *, finite: bool = False
) -> Iterator[memoryview]:
    """The file's bytes in order, one piece at a time: the length prefix and header, then each tensor's memory, where a
    :class:`Stacked` tensor's pieces come from one reused buffer: write each before asking for the next.

    ``finite``: every floating-point piece is checked for NaN and infinity before it is given (:class:`NonFinite` names
    the tensor), and a plain tensor comes in pieces of about :data:`STACKED_PIECE_BYTES` too, so that the check, the
    caller's checksum and its write each find the piece in the core's cache: one pass over the row's memory where a
    check of the whole tensor first was a second (issue 37)."""
    yield memoryview(safetensors_header(tensors, metadata))
    for name, tensor in tensors.items():
        if isinstance(tensor, Stacked):
            pieces: Iterator[memoryview] = tensor.pieces()
        else:
            view = _bytes_of(tensor)
            if not view.nbytes:
                continue
            pieces = _pieces_of(view) if finite else iter((view,))
        if not (finite and tensor.dtype.is_floating_point):
            yield from pieces
            continue
        for piece in pieces:
            if not finite_bytes(piece, tensor.dtype):
                raise NonFinite(name)
            yield piece


class NonFinite(ValueError):
    """A tensor being written holds NaN or infinite values (:func:`safetensors_stream` with ``finite``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} holds NaN or infinite values")
        self.name = name


def _pieces_of(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, view.nbytes, STACKED_PIECE_BYTES):
        yield view[start : start + STACKED_PIECE_BYTES]


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> int:
    """Write ``tensors`` (host, any layout) to ``path``; returns the file's size in bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return write_safetensors_to(fd, tensors, metadata)
    finally:
        os.close(fd)


def write_safetensors_to(
    fd: int, tensors: Mapping[str, torch.Tensor | Stacked], metadata: Mapping[str, str] | None = None
) -> int:
    """:func:`write_safetensors` to a file open for writing (at its offset, left open); returns the bytes written.
    Everything goes with ``os.writev`` from the tensors' own memory, a :class:`Stacked` tensor too when its parts are
    views of one tensor (:meth:`Stacked.whole`); else it is built and written a piece at a time. (A ``writev`` of one
    buffer per part per token instead held the server's interpreter lock for milliseconds a row: the wide bench model
    forwarded at half its pace, issue 37.)"""
    header = safetensors_header(tensors, metadata)
    total = len(header) + _data_bytes(tensors)  # safetensors_size, with the header built once
    # Sized first: a tmpfs mounted huge=within_size backs with huge pages only what lies within a file's size, and a
    # file that grows write by write gets small ones on kernels that look at the size alone (dump_pages.py)
    os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR) + total)
    views: list[memoryview] = [memoryview(header)]
    for tensor in tensors.values():
        whole = tensor.whole() if isinstance(tensor, Stacked) else tensor
        if whole is None:
            assert isinstance(tensor, Stacked)
            _write_all_views(fd, deque(views))
            views = []
            for piece in tensor.pieces():  # each piece written before the next is built in the same buffer
                _write_all_views(fd, deque((piece,)))
        elif (view := _bytes_of(whole)).nbytes:
            views.append(view)
    _write_all_views(fd, deque(views))
    return total


def _write_all_views(fd: int, pending: deque[memoryview]) -> None:
    """Every byte of ``pending`` in order, with as few ``os.writev`` calls as its limits allow."""
    while pending:
        batch: list[memoryview] = []
        room = _MAX_WRITE
        for view in pending:
            if room <= 0 or len(batch) == _MAX_BUFFERS:
                break
            batch.append(view[:room])
            room -= min(room, view.nbytes)
        written = os.writev(fd, batch)
        while written:  # drop what was written, keep the rest (writev may write less than asked)
            head = pending[0]
            if written >= head.nbytes:
                written -= head.nbytes
                pending.popleft()
            else:
                pending[0] = head[written:]
                written = 0
