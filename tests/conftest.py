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
