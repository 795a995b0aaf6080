#!/usr/bin/env python3
"""Write a byte-for-byte reproducible .tar.gz of source directories (for idempotent copies).

usage: pack_source.py OUT.tar.gz ROOT PATH [PATH ...]   (PATHs relative to ROOT)
Caches, build outputs and bytecode are left out; times, owners and order are fixed.
"""
import gzip
import io
import sys
import tarfile
from pathlib import Path

SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist"}


def members(root: Path, rel: str):
    top = root / rel
    paths = [top] if top.is_file() else sorted(p for p in top.rglob("*"))
    for path in paths:
        parts = path.relative_to(root).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts) or path.suffix in {".pyc", ".pyo"}:
            continue
        if path.is_file() and not path.is_symlink():
            yield path


def main() -> int:
    out, root, rels = Path(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3:]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in rels:
            for path in members(root, rel):
                info = tarfile.TarInfo(str(path.relative_to(root)))
                data = path.read_bytes()
                info.size, info.mtime, info.mode = len(data), 0, 0o755 if path.stat().st_mode & 0o111 else 0o644
                tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(buffer.getvalue(), compresslevel=6, mtime=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_bytes() != packed:
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(packed)
        tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
