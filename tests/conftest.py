"""Shared fixtures: real tiny models, a real embedded HTTP server, real files."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hsextract.capture.embedded import EmbeddedServer, Engine
from hsextract.config import ExtractConfig, ServeConfig
from hsextract.dev.tiny_model import make_tiny_model
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.run import Extraction, RunSummary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class RunningServer:
    def __init__(self, engine: Engine, server: EmbeddedServer) -> None:
        self.engine = engine
        self.server = server
        self.url = f"http://127.0.0.1:{server.port}"
        self.dump_dir = engine.dump_dir


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    started: list[RunningServer] = []

    def start(model: Path, **engine_kwargs: object) -> RunningServer:
        dump_dir = Path(str(engine_kwargs.pop("dump_dir", tmp_path / f"dumps{len(started)}")))
        engine = Engine(ServeConfig(model=model, dump_dir=dump_dir, **engine_kwargs))
        server = EmbeddedServer(engine, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running = RunningServer(engine, server)
        started.append(running)
        return running

    yield start
    for running in started:
        running.server.shutdown()


def run_extraction(server_url: str, dataset: Path, output: Path, **overrides: object) -> RunSummary:
    settings: dict[str, object] = {"health_timeout_s": 30, **overrides}
    config = ExtractConfig(server=server_url, dataset=dataset, output=output, **settings)  # type: ignore[arg-type]
    return Extraction(config, metrics=ExtractMetrics()).run()
