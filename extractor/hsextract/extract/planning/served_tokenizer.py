"""A dataset ``hsextract prepare`` made holds one tokenizer's ids: the server must serve a model of that tokenizer.

``prepare.json`` records the fingerprint of the tokenizer the rows were made with. Served by another model (of
the same vocabulary size, every id is in range), each row would be read as other text and the run would end
COMPLETE with states of nonsense. The served model's tokenizer is loaded from its directory and fingerprinted
as prepare does (:func:`~hsextract.prepare.model_tokenizer.load_tokenizer`), before any request. A model
directory not readable from here (another host's path, a hub id) cannot be compared: said, and not refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hsextract.contract.server_info import ServerInfo
from hsextract.errors import ConfigError
from hsextract.prepare.model_tokenizer import load_tokenizer, tokenizer_fingerprint
from hsextract.prepare.provenance import PROVENANCE_FILE, Provenance

log = logging.getLogger(__name__)

#: hex digits of a fingerprint shown in messages: enough to tell two apart
SHOWN = 16


def served_tokenizer_fingerprint(info: ServerInfo, trust_remote_code: bool) -> str | None:
    """The fingerprint of the served model's tokenizer; None (said in the log) when it cannot be loaded here."""
    model = Path(info.model_path) if info.model_path else None
    if model is None or not model.is_dir():
        log.warning(
            "the server's model %r is no directory here: the dataset's tokenizer (prepare.json) is not checked against it",
            info.model_path,
        )
        return None
    try:
        return tokenizer_fingerprint(load_tokenizer(model, trust_remote_code))
    except ConfigError as exc:
        log.warning(
            "the tokenizer of the server's model %s does not load here, so the dataset's tokenizer (prepare.json) is not "
            "checked against it (%s)",
            model,
            exc,
        )
        return None


def check_served_tokenizer(provenance: Provenance | None, info: ServerInfo, dataset: Path) -> None:
    """ConfigError, naming both tokenizers and the fix, when the dataset was prepared with another tokenizer than the
    served model's; nothing for a dataset prepare did not make."""
    if provenance is None:
        return
    prepared = provenance.settings.tokenizer_fingerprint
    served = served_tokenizer_fingerprint(info, provenance.trust_remote_code)
    if served is None or served == prepared:
        return
    prepared_with = provenance.model or "another model"
    raise ConfigError(
        f"--dataset {dataset} was prepared with the tokenizer of {prepared_with} (fingerprint {prepared[:SHOWN]}, its "
        f"{PROVENANCE_FILE}), but the server serves {info.model_path}, whose tokenizer has fingerprint {served[:SHOWN]}: "
        "its rows would be read as other text. Nothing was sent. Serve the model the dataset was prepared for, or "
        f"prepare the conversations again with --model {info.model_path} (a new prepare --output)"
    )
