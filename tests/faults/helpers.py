"""Shared code of the fault-injection tests, on real components: the embedded server (in this process, or as its own process
when it must be stopped with a signal), the ``hsextract extract`` CLI as a real process, real HTTP
servers in front of the real server (an auth wall, an HTML page, a switch between two servers),
real tmpfs mounts for full disks, real symlinks and signals.

The modules that mount or chown are marked ``root``. Every scenario ends the same way: rerun the
same command, then the output must pass ``verify`` and equal, byte for byte, an uninterrupted run's
(at one request in flight, so both runs batch alike: ``README``, "What identical means").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from hsextract.dev.tiny_model import make_tiny_model
from hsextract.output.verify import verify_output

from ..helpers import VOLATILE_FIELDS, free_port, tmpfs_mounts

VOCAB = 1024
REPO = Path(__file__).resolve().parents[2]


# -- data ---------------------------------------------------------------------------------------------
def make_rows(num: int, seed: int = 0, lengths: tuple[int, int] = (40, 160)) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        n = rng.randint(*lengths)
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        mask = [0] * (n // 3) + [1] * (n - n // 3)
        rows.append({"input_ids": ids, "loss_mask": mask})
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- the extractor as a process -----------------------------------------------------------------------
def extract_args(server: str, dataset: Path, output: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hsextract",
        "extract",
        "--server",
        server,
        "--dataset",
        str(dataset),
        "--output",
        str(output),
        "--concurrency",
        "1",
        "--health-timeout-s",
        "30",
        "--log-interval-s",
        "1",
        # these tests count and intercept /generate requests one by one; the spot check's extra
        # request of the first row has its own tests (tests/test_spot_check.py)
        "--spot-check-every",
        "0",
        *extra,
    ]


def run_extract(server: str, dataset: Path, output: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(extract_args(server, dataset, output, *extra), capture_output=True, text=True, timeout=timeout)


def start_extract(server: str, dataset: Path, output: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        extract_args(server, dataset, output, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def samples_written(output: Path) -> int:
    path = output / "samples.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for(
    condition: Callable[[], bool], timeout: float = 120, what: str = "condition", process: subprocess.Popen[str] | None = None
) -> None:
    """Poll ``condition``; fail after ``timeout`` s, or at once when ``process`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"the extractor exited ({process.returncode}) before {what}: {stderr[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill_after_samples(process: subprocess.Popen[str], output: Path, count: int) -> int:
    """SIGKILL the extractor once ``count`` samples are written; return how many were."""
    wait_for(lambda: samples_written(output) >= count or process.poll() is not None, what=f"{count} samples")
    process.send_signal(signal.SIGKILL)
    process.wait()
    return samples_written(output)


# -- comparing outputs --------------------------------------------------------------------------------
#: files that name the output's and the model's paths (SpecForge's config): compared with those taken out
_NAMES_THE_PATHS = ("specforge_train.yaml",)


def _file_digest(path: Path, paths: tuple[str, ...]) -> str:
    data = path.read_bytes()
    if path.name in _NAMES_THE_PATHS:
        for named in paths:
            data = data.replace(named.encode(), b"<path>")
    return hashlib.sha256(data).hexdigest()


def snapshot(output: Path, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything an output holds, minus the times and what ``ignore`` names (dotted keys)."""
    config = json.loads((output / "data_config.json").read_text())
    identity = json.loads((output / "identity.json").read_text())
    paths = (str(output.resolve()), str((config.get("model") or {}).get("path") or output.resolve()))
    for volatile in VOLATILE_FIELDS:
        config.pop(volatile, None)
    identity.pop("created_at", None)
    for dotted in ignore:
        for holder in (config, identity):
            *parents, leaf = dotted.split(".")
            target = holder
            for key in parents:
                target = target.get(key, {})
            if isinstance(target, dict):
                target.pop(leaf, None)
    files = {
        str(p.relative_to(output)): _file_digest(p, paths)
        for p in sorted(output.rglob("*"))
        if p.is_file() and p.name not in ("data_config.json", "identity.json") and "data/" not in str(p.relative_to(output))
    }
    return {"data_config": config, "identity": identity, "files": files}


def assert_same_output(output: Path, reference: Path, ignore: tuple[str, ...] = ()) -> None:
    report = verify_output(output)
    assert report.ok, report.summary()
    got, want = snapshot(output, ignore), snapshot(reference, ignore)
    assert got["data_config"] == want["data_config"]
    assert got["identity"] == want["identity"]
    extra, missing = sorted(got["files"].keys() - want["files"].keys()), sorted(want["files"].keys() - got["files"].keys())
    assert not extra and not missing, f"files only in {output}: {extra}; only in the uninterrupted run's: {missing}"
    differing = [name for name in got["files"] if got["files"][name] != want["files"][name]]
    assert not differing, f"files differ from the uninterrupted run: {differing[:5]}"


# -- models -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``main``: a tiny Llama; ``other``: another checkpoint of exactly the same shape (other seed)."""
    root = tmp_path_factory.mktemp("fault-models")
    return {
        name: make_tiny_model(root / name, arch="llama", layers=8, hidden=64, vocab_size=VOCAB, dtype="float32", seed=seed)
        for name, seed in (("main", 0), ("other", 1))
    }


# -- the embedded server as its own process -------------------------------------------------------------
@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    url: str
    dump_dir: Path
    log: Path

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(model: Path, dump_dir: Path | None = None, *extra: str, port: int | None = None) -> ServerProcess:
        port = port or free_port()
        dump = dump_dir or tmp_path / f"proc-dumps{len(started)}"
        log = tmp_path / f"server{len(started)}.log"
        args = [sys.executable, "-m", "hsextract", "serve", "--model", str(model), "--dump-dir", str(dump), "--port", str(port)]
        with open(log, "wb") as handle:
            process = subprocess.Popen([*args, *extra], stdout=handle, stderr=subprocess.STDOUT)
        server = ServerProcess(process, f"http://127.0.0.1:{port}", dump, log)
        started.append(server)

        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the server exited: {log.read_text()[-2000:]}")
            try:
                return httpx.get(server.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 180, "the server process")
        return server

    yield start
    for server in started:
        server.stop()


# -- real HTTP servers in front of the real one ----------------------------------------------------------
@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"


Rule = Callable[[str, str, bytes], Answer | None]  # (method, path, body) -> an answer, or None: forward


@dataclass
class Proxy:
    """A real HTTP server that forwards to ``upstream`` unless ``rule`` answers itself."""

    upstream: str
    rule: Rule = lambda method, path, body: None
    generate_calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, answer: Answer) -> None:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.path == "/generate":
                    with proxy.lock:
                        proxy.generate_calls += 1
                answer = proxy.rule(method, self.path, body)
                if answer is None:
                    try:
                        response = httpx.request(method, proxy.upstream + self.path, content=body or None, timeout=120)
                    except httpx.HTTPError:
                        answer = Answer(502, b"<html>502 Bad Gateway</html>", "text/html")
                    else:
                        answer = Answer(response.status_code, response.content, response.headers.get("content-type", ""))
                with contextlib.suppress(OSError):
                    self._answer(answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy() -> Iterator[Callable[..., Proxy]]:
    made: list[Proxy] = []

    def make(upstream: str, rule: Rule | None = None) -> Proxy:
        made.append(Proxy(upstream, rule) if rule else Proxy(upstream))
        return made[-1]

    yield make
    for item in made:
        item.close()


# -- full disks ------------------------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a small real tmpfs (root only); skipped with the reason where mounting is impossible."""
    with tmpfs_mounts(tmp_path) as mount:
        yield mount


def fill(filesystem: Path, leave_bytes: int) -> Path:
    """Take all free space of ``filesystem`` but ``leave_bytes`` with one file (another writer)."""
    filler = filesystem / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        # The extractor keeps writing meanwhile: what was free a moment ago may be gone, so retry
        # with what is free now.
        for _ in range(50):
            free = shutil.disk_usage(filesystem).free - leave_bytes
            if free <= 0:
                break
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, free)
                break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler
