"""Shared code of the monitoring tests: promtool, a real Prometheus server, an sshd, the dashboard.

Debian's `prometheus` and `openssh-server` come from `make monitoring-deps`
(scripts/monitoring/install-deps.sh); without them these tests fail and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..helpers import free_port

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
RULES = sorted((MONITORING / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = MONITORING / "grafana" / "hsextract.json"
RUNBOOKS = REPO / "docs" / "runbooks"


def tool(name: str, path: str | None = None) -> str:
    found = shutil.which(name) or (path if path and Path(path).exists() else None)
    if found is None:
        pytest.fail(f"{name} is not installed; run `make monitoring-deps` (scripts/monitoring/install-deps.sh) as root")
    return found


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold theirs
    return panels


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    return [(p["title"], t["expr"]) for p in dashboard_panels() for t in p.get("targets", [])]


def is_sglang_only(expr: str) -> bool:
    """Panels on SGLang's own metrics (job sglang): no data without a real SGLang, so only parsed there."""
    return "sglang:" in expr or 'job="sglang"' in expr


def substitute(
    expr: str, instance: str = ".+", sglang_instance: str = ".+", server_instance: str = ".+", rate_interval: str = "1m"
) -> str:
    """What Grafana sends: its variables replaced ("All" is the regex .+; a dot in an address matches itself)."""
    expr = expr.replace("$__rate_interval", rate_interval)
    expr = expr.replace("$sglang_instance", sglang_instance).replace("$server_instance", server_instance)
    return expr.replace("$instance", instance)


class Prometheus:
    """A real Prometheus on 127.0.0.1 with its own config and data directory."""

    def __init__(self, directory: Path, scrape_targets: dict[str, list[str]], rule_files: list[Path], interval: str = "1s"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in scrape_targets.items()
            ],
        }
        config_path = directory / "prometheus.yml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = directory / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10.0)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.http.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; a PromQL error fails with Prometheus's message."""
        response = self.http.get("/api/v1/query", params={"query": expr})
        body = response.json()
        assert body.get("status") == "success", f"query {expr!r} failed: {body.get('errorType')}: {body.get('error')}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def alerts(self) -> dict[str, str]:
        """Active alerts by name: 'pending' or 'firing'."""
        body = self.http.get("/api/v1/alerts").json()
        return {a["labels"]["alertname"]: a["state"] for a in body["data"]["alerts"]}

    def wait_for(self, what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.http.close()
        terminate(self.process)
        self._log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    started: list[Prometheus] = []

    def start(scrape_targets: dict[str, list[str]], rule_files: list[Path] | None = None) -> Prometheus:
        directory = tmp_path / f"prometheus{len(started)}"
        directory.mkdir()
        server = Prometheus(directory, scrape_targets, RULES if rule_files is None else rule_files)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


class SSHServer:
    """A real sshd on 127.0.0.1 (a child of the test) that accepts one generated key for root."""

    def __init__(self, directory: Path) -> None:
        keygen = tool("ssh-keygen")
        self.host_key = directory / "ssh_host_ed25519_key"
        self.client_key = directory / "id_ed25519"
        for key in (self.host_key, self.client_key):
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        authorized = directory / "authorized_keys"
        authorized.write_text(Path(str(self.client_key) + ".pub").read_text())
        authorized.chmod(0o600)
        self.port = free_port()
        config = directory / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {directory / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized}",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin prohibit-password",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        sshd = tool("sshd", "/usr/sbin/sshd")
        subprocess.run([sshd, "-t", "-f", str(config)], check=True, capture_output=True)
        self.log_path = directory / "sshd.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while not _port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {self.log_path.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        terminate(self.process)
        self._log.close()


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    if os.geteuid() != 0:
        pytest.fail("the sshd test host runs as root (as CI does); run the monitoring tests as root")
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = SSHServer(directory)
    yield server
    server.stop()
