"""``hsextract prepare``: conversations to the rows a trainer's own preprocessing makes (docs/data.md).

Modules, one job each: ``readers`` (JSONL / Parquet / save_to_disk input), ``conversation`` (the checks
every row passes, bad-row reasons), ``model_tokenizer`` (the model's tokenizer and chat template),
``registry`` (SpecForge's template registry and matching), ``specforge`` and ``speculators`` (the two
conventions), ``writer`` (resumable, atomic output), ``provenance`` (``prepare.json``), ``run``.
"""

from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.provenance import Provenance, Settings, read_provenance

__all__ = ["PrepareConfig", "Provenance", "Settings", "read_provenance"]
