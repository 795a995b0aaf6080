"""The output formats' facts the deployment needs, generated from the format registry.

Ansible cannot import the registry, so ``roles/hsx_extractor/vars/formats.yml`` holds what it says
about each format: the names, the storages it writes, whether its dumps carry the pre-norm final state,
and why it refuses another storage. The role's preflight reads the file (``include_vars``), and so does
the ``/dev/shm`` filter (``roles/hsx_container_env/filter_plugins/shm_budget.py``, which also gives
``playbooks/vars/deploy.yml`` the pre-norm rule). Nothing in the deployment restates a format's rule.

    python -m hsextract.dev.format_facts [--check] [REPO]

writes the file (``--check``: exit 1 when the committed one differs); ``tests/unit/output/test_formats.py``
checks it too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from hsextract.output.formats import FORMATS, format_class
from hsextract.output.formats.base import AUTO_STORAGE

#: the generated file, relative to the repository root
FACTS_FILE = Path("roles/hsx_extractor/vars/formats.yml")
_HEADER = (
    "---\n"
    "# Generated from hsextract's output-format registry (extractor/hsextract/output/formats/) by\n"
    "# `python -m hsextract.dev.format_facts`: do not edit; a unit test checks it against the registry.\n"
    "# Read by roles/hsx_extractor/tasks/preflight.yml and roles/hsx_container_env/filter_plugins/shm_budget.py.\n"
)


def format_facts() -> dict[str, Any]:
    """Each registered format's deployment facts, in registry order."""
    formats: dict[str, Any] = {}
    for name in FORMATS:
        cls = format_class(name)
        formats[name] = {
            "storages": [AUTO_STORAGE, *cls.storages],
            "final_prenorm": cls.needs_final_prenorm,
            "storage_refusal": cls.storage_refusal_message(),
        }
    storages = [AUTO_STORAGE, *dict.fromkeys(s for f in formats.values() for s in f["storages"] if s != AUTO_STORAGE)]
    return {
        "_hsx_extractor_format_names": list(FORMATS),
        "_hsx_extractor_format_storages": storages,
        "_hsx_extractor_formats": formats,
    }


def render() -> str:
    """The text of :data:`FACTS_FILE`."""
    return _HEADER + yaml.safe_dump(format_facts(), sort_keys=False, width=1000, default_flow_style=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hsextract.dev.format_facts", description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", type=Path, default=Path.cwd(), help="repository root (default: .)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file differs")
    args = parser.parse_args(argv)
    path = args.repo / FACTS_FILE
    text = render()
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} differs from the format registry; run python -m hsextract.dev.format_facts", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
