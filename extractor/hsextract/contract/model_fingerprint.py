"""Which model an output was extracted from, independent of where it lies.

A fingerprint covers the model's ``config.json`` (parsed, so formatting does not matter; the
``_name_or_path`` key, which records where it was loaded from, is left out), every ``*.index.json``
weight index, and each weight file's name, size and eight 64 KiB samples of its bytes (start,
end and evenly between). A copied, moved or renamed model directory has the same fingerprint;
another checkpoint of the same architecture has another one (its weights differ wherever they
are sampled), at the cost of reading 512 KiB per weight file instead of the whole model.

The server side computes it once at start (``/server_info`` ``model_fingerprint``, every dump's
``meta.json``); the extractor records it in the output's identity and compares every dump with it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLES_PER_FILE = 8
SAMPLE_BYTES = 64 * 1024
#: config keys that say where the model was loaded from, not what it is
_LOCATION_KEYS = ("_name_or_path",)


def _canonical_json(path: Path) -> bytes:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _LOCATION_KEYS}
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _sample_offsets(size: int) -> list[int]:
    if size <= SAMPLES_PER_FILE * SAMPLE_BYTES:
        return [0] if size else []
    last = size - SAMPLE_BYTES
    return sorted({last * i // (SAMPLES_PER_FILE - 1) for i in range(SAMPLES_PER_FILE)})


def model_fingerprint(model_path: str | Path) -> str | None:
    """``sha256:<hex>`` of the model at ``model_path``; None when it is not a readable model
    directory from here (a hub id, another host's path)."""
    path = Path(model_path)
    digest = hashlib.sha256()
    try:
        digest.update(b"config.json\0" + _canonical_json(path / "config.json") + b"\0")
        for index in sorted(path.glob("*.index.json")):
            digest.update(index.name.encode() + b"\0" + _canonical_json(index) + b"\0")
        weights = sorted(p for p in path.iterdir() if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())
        for weight in weights:
            size = weight.stat().st_size
            digest.update(f"{weight.name}\0{size}\0".encode())
            with open(weight, "rb") as handle:
                for offset in _sample_offsets(size):
                    handle.seek(offset)
                    digest.update(handle.read(SAMPLE_BYTES if size > SAMPLE_BYTES * SAMPLES_PER_FILE else size))
    except (OSError, ValueError):
        return None
    return "sha256:" + digest.hexdigest()
