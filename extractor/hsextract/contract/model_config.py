"""Read a model's ``config.json`` the way every part of the bundle needs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError


def check_model_dir(model_path: Path, flag: str) -> None:
    """ConfigError naming ``flag`` unless ``model_path`` is a directory with a config.json (a save_pretrained one)."""
    if not model_path.exists():
        raise ConfigError(f"model {model_path} does not exist; give {flag} a save_pretrained directory on this machine "
                          "(check the path's spelling, and that its filesystem is mounted)")
    if not model_path.is_dir():
        raise ConfigError(f"model {model_path} is a file, not a directory; give {flag} the save_pretrained directory "
                          "that holds config.json and the weights")
    if not (model_path / "config.json").exists():
        raise ConfigError(f"model {model_path} has no config.json; give {flag} a save_pretrained directory")


def read_model_config(model_path: str | Path) -> dict[str, Any]:
    """The model's config.json, or ``{}`` when it is not readable from here.

    Multimodal wrappers (Kimi-K2.5) keep the language model's numbers under ``text_config``;
    those win over the top level."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {**config, **config.get("text_config", {})} if isinstance(config, dict) else {}
