"""Check that an installed distribution's runtime requirements are met by what is installed.

Used at image build time: hsextract is installed with ``pip install --no-deps`` so that pip can
never replace the SGLang image's torch/transformers/CUDA stack; this check then proves that the
image already provides every dependency hsextract declares (at a version in range) and fails the
build with a list otherwise, instead of failing at the first import on a GPU host.

    python3 check_requirements.py DIST [--strict 0|1]

Exit 0 when every requirement is met, or when ``--strict 0`` (report only); 1 otherwise.
Standard library only, plus ``packaging`` (or pip's vendored copy) to compare versions.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip always vendors packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment]


def problems(dist: str) -> tuple[list[str], list[str]]:
    """(lines for requirements met, lines for requirements not met) of ``dist``."""
    met: list[str] = []
    unmet: list[str] = []
    for spec in metadata.requires(dist) or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or another platform's requirement
        name = canonicalize_name(req.name)
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req.name}: not installed (needs {req.specifier or 'any version'})")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req.name}: {version} installed, needs {req.specifier}")
        else:
            met.append(f"{req.name} {version}")
    return met, unmet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist")
    parser.add_argument("--strict", choices=("0", "1"), default="1")
    args = parser.parse_args()
    met, unmet = problems(args.dist)
    print(f"{args.dist} requirements met: {', '.join(met) or 'none'}")
    if not unmet:
        return 0
    print(f"{args.dist} requirements NOT met by this image:", file=sys.stderr)
    for line in unmet:
        print(f"  {line}", file=sys.stderr)
    if args.strict == "0":
        print("(--strict 0: reported only)", file=sys.stderr)
        return 0
    print(
        "Install the missing ones in docker/Dockerfile with pinned versions (never torch: it must stay the "
        "image's CUDA build), or use an SGLang image that provides them.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
