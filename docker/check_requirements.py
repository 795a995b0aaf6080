"""Check that an installed distribution's runtime requirements are met by what is installed.

Used at image build time: hsextract is installed with ``pip install --no-deps`` so that pip can
never replace the SGLang image's torch/transformers/CUDA stack; this check then proves that the
image already provides every dependency hsextract declares (at a version in range) and fails the
build with a list otherwise, instead of failing at the first import on a GPU host.

    python3 check_requirements.py DIST [--ignore "NAME NAME,NAME"]...

``--ignore``: requirements not checked (not needed where this runs, or known to be absent).
Exit 0 when every other requirement is met, 1 otherwise. Standard library only, plus
``packaging`` (or pip's vendored copy) to compare versions.
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


def problems(dist: str, ignore: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(requirements met, requirements not met, requirements ignored) of ``dist``, as lines."""
    met: list[str] = []
    unmet: list[str] = []
    ignored: list[str] = []
    for spec in metadata.requires(dist) or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or another platform's requirement
        name = canonicalize_name(req.name)
        if name in ignore:
            ignored.append(str(req))
            continue
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req.name}: not installed (needs {req.specifier or 'any version'})")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req.name}: {version} installed, needs {req.specifier}")
        else:
            met.append(f"{req.name} {version}")
    return met, unmet, ignored


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist")
    parser.add_argument("--ignore", action="append", default=[], help="names not to check (space or comma separated)")
    args = parser.parse_args()
    ignore: set[str] = {canonicalize_name(n) for value in args.ignore for n in value.replace(",", " ").split()}
    met, unmet, ignored = problems(args.dist, ignore)
    print(f"{args.dist} requirements met: {', '.join(met) or 'none'}")
    if ignored:
        print(f"{args.dist} requirements not checked (--ignore): {', '.join(ignored)}")
    if not unmet:
        return 0
    print(f"{args.dist} requirements NOT met by this image:", file=sys.stderr)
    for line in unmet:
        print(f"  {line}", file=sys.stderr)
    print(
        "Install the missing ones in docker/Dockerfile with pinned versions (never torch: it must stay the "
        "image's CUDA build), or use an SGLang image that provides them.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
