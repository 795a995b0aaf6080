"""What a finished run tells its user: the end-of-run summary's lines about serving and training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hsextract.extract.formats import format_class
from hsextract.extract.serving_hints import SGLangServing, serving_line


def summary_lines(serving: SGLangServing, trainer: dict[str, Any], output: Path, format_name: str) -> list[str]:
    """The end-of-run summary's lines about serving (SGLang's value) and training (the format's trainer)."""
    return [serving_line(serving), format_class(format_name).trainer_summary(trainer, output)]
