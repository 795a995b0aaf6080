"""Output formats that existing trainers read directly."""

from pathlib import Path

from .base import OutputFormat, StoredSample
from .specforge import SpecForgeFormat
from .speculators import SpeculatorsFormat

FORMATS: dict[str, type[OutputFormat]] = {"specforge": SpecForgeFormat, "speculators": SpeculatorsFormat}


def open_format(name: str, root: Path) -> OutputFormat:
    return FORMATS[name](root)


__all__ = ["FORMATS", "OutputFormat", "SpecForgeFormat", "SpeculatorsFormat", "StoredSample", "open_format"]
