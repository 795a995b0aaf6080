"""Read a model's ``config.json`` the way every part of the bundle needs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_model_config(model_path: str | Path) -> dict[str, Any]:
    """The model's config.json, or ``{}`` when it is not readable from here.

    Multimodal wrappers (Kimi-K2.5) keep the language model's numbers under ``text_config``;
    those win over the top level."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {**config, **config.get("text_config", {})} if isinstance(config, dict) else {}
