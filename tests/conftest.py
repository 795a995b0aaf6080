"""Fixtures of the package tests: real tiny models and real embedded HTTP servers.

Tests outside tests/unit are marked ``integration`` here (they start servers or run models);
``make test-fast`` runs tests/unit only. Shared helpers live in tests/helpers.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hsextract.dev.tiny_model import make_tiny_model

from .helpers import RunningServer
from .regen_server import FakeSGLang

UNIT_DIR = Path(__file__).parent / "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT_DIR not in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    made: dict[tuple[str, str], Path] = {}

    def get(arch: str = "deepseek_v3", dtype: str = "float32") -> Path:
        key = (arch, dtype)
        if key not in made:
            made[key] = make_tiny_model(
                tmp_path_factory.mktemp(f"model-{arch}-{dtype}"), arch=arch, layers=8, hidden=64, dtype=dtype, vocab_size=1024
            )
        return made[key]

    yield get


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    started: list[RunningServer] = []

    def start(model: Path, **engine_settings: object) -> RunningServer:
        dump_dir = Path(str(engine_settings.pop("dump_dir", tmp_path / f"dumps{len(started)}")))
        running = RunningServer.start(model, dump_dir, **engine_settings)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 tiny Qwen2 with its ChatML tokenizer: the model a fake SGLang server names (regeneration tests)."""
    return make_tiny_model(tmp_path_factory.mktemp("regen-model"), arch="qwen2", layers=8, hidden=32, vocab_size=1024,
                           dtype="float32")


@pytest.fixture
def fake(chat_model: Path) -> Iterator[FakeSGLang]:
    """tests/regen_server.py's HTTP server in SGLang's /generate decode shapes, serving ``chat_model``."""
    server = FakeSGLang(str(chat_model))
    yield server
    server.stop()
