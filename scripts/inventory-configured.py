#!/usr/bin/env python3
"""Exit 0 when an Ansible inventory (a file or a directory) is configured: it exists and no value in it is
still the placeholder CHANGE_ME. Exit 1 otherwise, naming on stderr the first file and key left at it.

mk/ansible.mk asks this to pick `make extract`'s path (the containers, or the embedded default) and the
inventory of `make status` and `make merge`. Only values count: inventory/example explains CHANGE_ME in its
comments, and a configured copy keeps those comments. YAML files are read with PyYAML; a file that is not
YAML (an INI inventory) is read line by line with its comments (# or ;) left out.

usage: inventory-configured.py INVENTORY
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

PLACEHOLDER = "CHANGE_ME"
# what Ansible skips in an inventory directory (its INVENTORY_IGNORE_EXTS) and editor leftovers
_IGNORED = (".md", ".txt", ".rst", ".orig", ".bak", ".retry", ".pyc", ".pyo", ".swp", "~")


def _files(inventory: Path) -> Iterator[Path]:
    if inventory.is_file():
        yield inventory
        return
    for path in sorted(inventory.rglob("*")):
        parts = path.relative_to(inventory).parts
        if path.is_file() and not any(p.startswith(".") for p in parts) and not path.name.endswith(_IGNORED):
            yield path


def _placeholders(value: object, where: str) -> Iterator[str]:
    """Keys (dotted) whose value is or holds the placeholder."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _placeholders(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _placeholders(item, f"{where}[{index}]")
    elif isinstance(value, str) and PLACEHOLDER in value:
        yield where or "(the file)"


def _ini_placeholders(text: str) -> Iterator[str]:
    for number, line in enumerate(text.splitlines(), start=1):
        value = re.sub(r"(^|\s)[#;].*", "", line)
        if PLACEHOLDER in value:
            yield f"line {number}"


def left_at_placeholder(inventory: Path) -> list[str]:
    """'FILE: KEY' for every value still at CHANGE_ME."""
    try:
        import yaml
    except ImportError:  # no PyYAML on this Python: the comment-free line scan reads YAML correctly enough
        yaml = None  # type: ignore[assignment]
    found: list[str] = []
    for path in _files(inventory):
        text = path.read_text(errors="replace")
        if PLACEHOLDER not in text:
            continue
        keys: list[str]
        if yaml is None:
            keys = list(_ini_placeholders(text))
        else:
            try:
                keys = [key for document in yaml.safe_load_all(text) for key in _placeholders(document, "")]
            except yaml.YAMLError:
                keys = list(_ini_placeholders(text))
        found += [f"{path}: {key}" for key in keys]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.rsplit("usage: ", 1)[1], file=sys.stderr)
        return 2
    inventory = Path(argv[1])
    if not inventory.exists():
        print(f"inventory {inventory} does not exist", file=sys.stderr)
        return 1
    left = left_at_placeholder(inventory)
    if left:
        print(f"inventory {inventory} is not configured: {left[0]} is {PLACEHOLDER}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
