"""Output formats that existing trainers read directly."""

from pathlib import Path

from hsextract.extract.formats.base import OutputFormat, StoredSample
from hsextract.extract.formats.specforge import SpecForgeFormat
from hsextract.extract.formats.speculators import SpeculatorsFormat

FORMATS: dict[str, type[OutputFormat]] = {"specforge": SpecForgeFormat, "speculators": SpeculatorsFormat}


def open_format(name: str, root: Path) -> OutputFormat:
    return FORMATS[name](root)


__all__ = ["FORMATS", "OutputFormat", "SpecForgeFormat", "SpeculatorsFormat", "StoredSample", "open_format"]
