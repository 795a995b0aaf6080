"""A prepared dataset against the server's model (issue 39, item 2): its prepare.json's tokenizer fingerprint must be
the served model's tokenizer's, computed as prepare computes it; a model directory not readable here is said and
skipped, not refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hsextract.contract.server_info import ServerInfo
from hsextract.dev.tokenizer import write_tokenizer
from hsextract.errors import ConfigError
from hsextract.extract.planning.served_tokenizer import check_served_tokenizer
from hsextract.prepare.model_tokenizer import load_model_tokenizer
from hsextract.prepare.provenance import Provenance, Settings

DATASET = Path("/data/prepared")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {family: write_tokenizer(tmp_path_factory.mktemp(f"tok-{family}"), family, 1024) for family in ("chatml", "llama3")}


def _prepared_with(model: Path) -> Provenance:
    fingerprint = load_model_tokenizer(model, None, trust_remote_code=False).fingerprint
    settings = Settings("speculators", None, 4096, fingerprint, "0" * 64, str(model), 1024, "/c.jsonl", None, "x", 4, 1000)
    return Provenance(settings, model=str(model))


def _serving(model_path: str) -> ServerInfo:
    return ServerInfo(model_path, 8, 64, 1024, "float32", [1, 3, 4], "/x", "hsextract-embedded", True)


def test_the_model_the_dataset_was_prepared_with_passes(tokenizers: dict[str, Path]) -> None:
    check_served_tokenizer(_prepared_with(tokenizers["chatml"]), _serving(str(tokenizers["chatml"])), DATASET)


def test_another_models_tokenizer_is_refused_naming_both_and_the_fix(tokenizers: dict[str, Path]) -> None:
    provenance = _prepared_with(tokenizers["chatml"])
    with pytest.raises(ConfigError) as caught:
        check_served_tokenizer(provenance, _serving(str(tokenizers["llama3"])), DATASET)
    message = str(caught.value)
    assert str(tokenizers["chatml"]) in message and provenance.settings.tokenizer_fingerprint[:16] in message
    assert str(tokenizers["llama3"]) in message and f"--model {tokenizers['llama3']}" in message


def test_a_server_model_not_readable_here_is_said_and_skipped(
    tokenizers: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hsextract.extract.planning.served_tokenizer"):
        check_served_tokenizer(_prepared_with(tokenizers["chatml"]), _serving("/models/on-another-host"), DATASET)
    assert "/models/on-another-host" in caplog.text and "not checked" in caplog.text


def test_a_dataset_prepare_did_not_make_is_not_checked(tokenizers: dict[str, Path]) -> None:
    check_served_tokenizer(None, _serving(str(tokenizers["llama3"])), DATASET)
