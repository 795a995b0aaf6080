"""The ``lossy`` fixture (a fresh power-loss filesystem per test) and the marks of tests/powerloss.

Every test here is ``integration`` and ``root``: it mounts a FUSE filesystem in its own process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..faults.helpers import models, server_process  # noqa: F401 - fixtures, found by their names here
from .helpers import LossyMount

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.root)


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[LossyMount]:
    mount = LossyMount.start(tmp_path)
    yield mount
    mount.stop()
