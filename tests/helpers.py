"""Helpers the package tests share: free ports, a real embedded server in-process, one extraction run."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hsextract.capture.embedded import Engine
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.front import HttpFront
from hsextract.extract.config import ExtractConfig
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.outcome import RunSummary
from hsextract.extract.run import Extraction

#: data_config.json fields that legitimately differ between two runs producing the same data
#: what differs between an uninterrupted run and a resumed one by design: times, and the last run's spot checks
VOLATILE_FIELDS = ("created_at", "updated_at", "created_unix", "extractor_version", "spot_checks")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningServer:
    """An embedded server on a free loopback port, its engine and its dump root."""

    def __init__(self, engine: Engine, server: HttpFront) -> None:
        self.engine = engine
        self.server = server
        self.url = f"http://127.0.0.1:{server.port}"
        self.dump_dir = engine.dump_dir

    @classmethod
    def start(cls, model: Path, dump_dir: Path, **engine_settings: object) -> RunningServer:
        engine = Engine(ServeConfig(model=model, dump_dir=dump_dir, **engine_settings))  # type: ignore[arg-type]
        server = HttpFront(engine, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, name="test-http", daemon=True).start()
        return cls(engine, server)

    def stop(self) -> None:
        self.server.shutdown()


def run_extraction(
    server_url: str, dataset: Path, output: Path, metrics: ExtractMetrics | None = None, **overrides: object
) -> RunSummary:
    settings: dict[str, object] = {"health_timeout_s": 30, **overrides}
    config = ExtractConfig(server=server_url, dataset=dataset, output=output, **settings)  # type: ignore[arg-type]
    return Extraction(config, metrics=metrics or ExtractMetrics()).run()


@contextmanager
def tmpfs_mounts(parent: Path) -> Iterator[Callable[..., Path]]:
    """``mount(name, size_bytes, options="")``: a real tmpfs at ``parent / name``, with ``options`` besides its size
    (root only; skipped with the reason where mounting is impossible); every one is unmounted at the end."""
    mounted: list[Path] = []

    def mount(name: str, size_bytes: int, options: str = "") -> Path:
        point = parent / name
        point.mkdir()
        every = ",".join(filter(None, [f"size={size_bytes}", "mode=0755", options]))
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", every, "tmpfs", str(point)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {result.stderr.strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], check=False)
