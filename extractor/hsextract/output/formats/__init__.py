"""Output formats that existing trainers read directly: the registry.

One entry per format, as pip's ``commands_dict``: the name maps to the module and class that own
everything about the format (file layout, the storage dtypes it can write, its trainer's length and
layer rules and settings, bytes per token for the disk preflight, its verify and merge hooks). A new
format is one new module and one line here; ``ExtractConfig.format`` (``extract/config.py``) takes its allowed values from
:data:`FORMAT_NAMES`, and ``tests/unit/output/test_formats.py`` checks the Ansible role's choices
against it.

The table is import-light (the classes load on first use, torch with them), so ``hsextract.extract.config``
can name the formats without importing the writers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hsextract.output.formats.base import OutputFormat


@dataclass(frozen=True)
class FormatEntry:
    """Where a format's class lives, and one line about it (``--help``)."""

    module: str
    class_name: str
    summary: str


FORMATS: dict[str, FormatEntry] = {
    "specforge": FormatEntry(
        "hsextract.output.formats.specforge",
        "SpecForgeFormat",
        "SpecForge's offline layout (rows_*/data_*.ckpt, bfloat16)",
    ),
    "speculators": FormatEntry(
        "hsextract.output.formats.speculators",
        "SpeculatorsFormat",
        "vllm-project/speculators' layout (hidden_states/hs_*.safetensors + data/; FP8 storage possible)",
    ),
}
#: the names ``--format`` accepts, in registry order (the first is the default)
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)
DEFAULT_FORMAT = FORMAT_NAMES[0]


def format_class(name: str) -> type[OutputFormat]:
    """The class that owns format ``name``; ValueError naming the known formats otherwise."""
    entry = FORMATS.get(name)
    if entry is None:
        raise ValueError(f"unknown output format {name!r}; known formats: {', '.join(FORMAT_NAMES)}")
    cls: type[OutputFormat] = getattr(importlib.import_module(entry.module), entry.class_name)
    return cls


def open_format(name: str, root: Path) -> OutputFormat:
    return format_class(name)(root)


__all__ = ["DEFAULT_FORMAT", "FORMATS", "FORMAT_NAMES", "FormatEntry", "format_class", "open_format"]
