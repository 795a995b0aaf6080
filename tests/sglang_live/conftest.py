"""Fixtures of tests/sglang_live: the real SGLang 0.5.23 server on the CPU, one start per model family.

``live(family)`` gives the family's running server and stops the other family's first, so the suite
holds one server at a time and starts each family once (the tests are ordered by family: a module-
scoped ``family`` parameter groups them; the operational tests use the family started last). A test
that kills the server restarts it through the same launcher config, and later tests use that one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from .helpers import HIDDEN, HSEXTRACT, LAYERS, VOCAB, LiveServer, free_port, server_config

FAMILIES = ("llama", "qwen2")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def stub_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the stand-in sgl_kernel records that it was imported and any call (there must be none)."""
    return tmp_path_factory.mktemp("stub") / "sgl_kernel-calls.log"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            path = tmp_path_factory.mktemp("models") / arch
            subprocess.run(
                [HSEXTRACT, "make-tiny-model", "--arch", arch, "--layers", str(LAYERS), "--hidden", str(HIDDEN),
                 "--vocab-size", str(VOCAB), "--dtype", "float32", str(path)],
                check=True, capture_output=True,
            )  # fmt: skip
            made[arch] = path
        return made[arch]

    return get


@pytest.fixture(scope="session")
def live(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path], stub_log: Path
) -> Iterator[Callable[[str], LiveServer]]:
    servers: dict[str, LiveServer] = {}
    current: list[LiveServer] = []

    def get(family: str) -> LiveServer:
        if current and current[0].family == family:
            server = current[0]
            if server.process is None or server.process.poll() is not None:
                server.start()  # a test killed it and failed before restarting it
            return server
        while current:
            current.pop().stop()
        workdir = tmp_path_factory.mktemp(f"live-{family}")
        config = server_config(tiny_model(family), free_port(), workdir / "dumps")
        config_path = workdir / "sglang.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=True))
        server = servers[family] = LiveServer(family, tiny_model(family), config_path, workdir, stub_log)
        current.append(server)
        server.start()
        return server

    yield get
    while current:
        current.pop().stop()
    for server in servers.values():
        print(
            f"\nlive {server.family} server: {server.starts} start(s), ready after {[round(s) for s in server.start_seconds]} s"
        )


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)
