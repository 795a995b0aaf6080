"""``hsextract regenerate``: every assistant turn answered again by the target model (docs/regenerate.md).

Modules, one job each: ``config`` (the options), ``client`` (``/generate`` with decoding, SGLang's
shapes), ``prompts`` (the history rendered as prepare renders it, stop ids, local decoding, reasoning),
``conversation`` (one row regenerated), ``journal`` (identity and settled rows, for resume),
``writer`` (the output, atomically, with errors and summary), ``metrics``, ``run`` (the loop),
``merge`` (a sharded run's outputs joined in input order), ``commands`` (the two CLI commands).
"""

from hsextract.regen.config import RegenerateConfig
from hsextract.regen.run import Regeneration, RegenSummary

__all__ = ["RegenSummary", "RegenerateConfig", "Regeneration"]
