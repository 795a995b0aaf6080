"""What one call of ``bench_gpu_drafter`` hands the next: the trained target and the regenerated
conversations, so that a later call (a fresh machine) trains drafters on the same data without
training the target or regenerating again.

A device call brings back at most 16 MiB a file, so the bundle is one ``tar.gz`` cut into parts of
:data:`PART_BYTES`, with ``bundle.json`` naming the parts, the members and the whole archive's
sha256; :func:`load` refuses a bundle whose parts do not add up to that checksum.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

PART_BYTES = 15 * 2**20
MANIFEST = "bundle.json"
PART_PREFIX = "bundle.tgz."


def save(work: Path, members: list[str], dest: Path) -> dict[str, Any]:
    """Archive ``members`` (paths relative to ``work``) into parts under ``dest``; returns the manifest."""
    missing = [name for name in members if not (work / name).exists()]
    if missing:
        raise FileNotFoundError(f"the bundle's members are missing from {work}: {missing}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name in members:
            tar.add(work / name, arcname=name)
    data = buffer.getvalue()
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        part = f"{PART_PREFIX}{index:03d}"
        (dest / part).write_bytes(data[start : start + PART_BYTES])
        parts.append(part)
    manifest = {"members": members, "parts": parts, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load(source: Path, work: Path) -> dict[str, Any]:
    """Check and unpack a bundle :func:`save` wrote into ``work``; returns its manifest."""
    manifest_path = source / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{source} holds no {MANIFEST}: not a bundle (bench_gpu_drafter.py --bundle-out writes one)")
    manifest = json.loads(manifest_path.read_text())
    missing = [part for part in manifest["parts"] if not (source / part).is_file()]
    if missing:
        raise FileNotFoundError(f"{source} lacks the bundle's parts {missing}: bring back every part of the call that wrote it")
    data = b"".join((source / part).read_bytes() for part in manifest["parts"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest["sha256"] or len(data) != manifest["bytes"]:
        raise ValueError(f"{source}: the parts add up to {len(data)} bytes, sha256 {digest}; {MANIFEST} says "
                         f"{manifest['bytes']} bytes, {manifest['sha256']}: a part is torn or from another bundle")  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(work, filter="data")
    return manifest
