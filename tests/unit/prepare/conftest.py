"""A real tokenizer (byte-level BPE of the ChatML family, as make-tiny-model writes) shared by the prepare tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsextract.dev.tokenizer import write_tokenizer


@pytest.fixture(scope="session")
def chatml_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok-chatml"), "chatml", 1024)


@pytest.fixture(scope="session")
def llama3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok-llama3"), "llama3", 1024)
