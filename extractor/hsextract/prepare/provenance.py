"""``prepare.json``: where a prepared dataset came from and what was made of it; written last.

A prepared dataset is complete exactly when its ``prepare.json`` exists (the directory is moved into
place in one rename with it inside). :func:`read_provenance` is what ``extract`` reads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hsextract.durable.atomic import atomic_write_bytes
from hsextract.errors import ConfigError

PROVENANCE_FILE = "prepare.json"
ERRORS_FILE = "errors.jsonl"
SCHEMA = 1


@dataclass(frozen=True)
class Settings:
    """What decides the rows: a resume with other settings is refused."""

    like: str
    specforge_template: str | None
    max_seq_len: int
    tokenizer_fingerprint: str
    chat_template_sha256: str
    chat_template_source: str
    vocab_size: int
    input_path: str
    input_split: str | None
    input_fingerprint: str
    input_rows: int
    chunk_rows: int


@dataclass(frozen=True)
class Provenance:
    settings: Settings
    counts: dict[str, Any] = field(default_factory=dict)
    hsextract_version: str = ""
    schema: int = SCHEMA
    #: the model directory whose tokenizer made the rows, and whether its own code was run: how extract loads the
    #: served model's tokenizer to compare fingerprints (empty and False in an older prepare.json)
    model: str = ""
    trust_remote_code: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_provenance(directory: Path, provenance: Provenance) -> None:
    data = json.dumps(provenance.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write_bytes(Path(directory) / PROVENANCE_FILE, data.encode())


def read_provenance(directory: Path) -> Provenance | None:
    """The provenance of a prepared dataset, or None when ``directory`` is no (complete) prepared dataset."""
    path = Path(directory) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Provenance(
            settings=Settings(**data["settings"]),
            counts=dict(data["counts"]),
            hsextract_version=str(data.get("hsextract_version", "")),
            schema=int(data["schema"]),
            model=str(data.get("model", "")),
            trust_remote_code=bool(data.get("trust_remote_code", False)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a prepare.json this hsextract reads ({exc}); rerun hsextract prepare") from None
