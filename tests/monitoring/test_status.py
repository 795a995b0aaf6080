"""`make status` / `make logs` (hsextract status) against this machine and against a real SSH host.

The host runs a real embedded server and the metrics endpoint of a real, finished extraction; the SSH
host is a real sshd on 127.0.0.1 (a child of the test) reached with fabric through an inventory that
`ansible-inventory` resolves.

`make` runs in a checkout that holds a finished `work/output`, as one does after `make extract` (issue 29,
item 1): the repository's files linked into a fresh directory, and a real finished output copied in. No test
here reads what `make extract` left in the real checkout, and CI (a clean clone) sees that case too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hsextract.capture.embedded import Engine
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.front import HttpFront
from hsextract.dev.sample_data import make_sample_data
from hsextract.ops import status as ops_status
from hsextract.ops.inventory import Target

from ..helpers import free_port, run_extraction
from .helpers import REPO, SSHServer

ROWS = 8


@dataclass
class LiveHost:
    server_port: int
    metrics_port: int
    output: Path
    dump_dir: Path
    tokens: int


@pytest.fixture(scope="module")
def live_host(model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    """A real embedded server, and a real extraction that finished and still serves its /metrics."""
    work = tmp_path_factory.mktemp("status")
    dump_dir = Path(f"/dev/shm/hsx-status-test-{os.getpid()}")
    engine = Engine(ServeConfig(model=model_dir(), dump_dir=dump_dir))
    server = HttpFront(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dataset = make_sample_data(work / "data.jsonl", ROWS, vocab_size=1024, seed=1)
    with dataset.open("a") as f:
        f.write("not json\n")  # one bad row: an error by reason
    metrics_port = free_port()
    summary = run_extraction(
        f"http://127.0.0.1:{server.port}",
        dataset,
        work / "output",
        metrics_port=metrics_port,
        metrics_host="127.0.0.1",
        max_seq_len=64,
    )
    assert summary.status == "complete" and summary.total_samples == ROWS
    yield LiveHost(server.port, metrics_port, work / "output", dump_dir, summary.total_tokens)
    server.shutdown()
    shutil.rmtree(dump_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def checkout(live_host: LiveHost, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as `make extract` leaves it: every top-level entry linked, and a finished work/output."""
    root = tmp_path_factory.mktemp("checkout")
    for entry in REPO.iterdir():
        if entry.name != "work":
            (root / entry.name).symlink_to(entry)
    shutil.copytree(live_host.output, root / "work" / "output")
    assert json.loads((root / "work" / "output" / "data_config.json").read_text())["status"] == "complete"
    return root


@pytest.fixture(autouse=True)
def _in_checkout(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "MAKE_DIR", checkout)


MAKE_DIR = REPO  # the checkout make runs in: `checkout` for every test of this module


def make_status(*args: str, target: str = "status") -> subprocess.CompletedProcess[str]:
    # -o: .venv is set up already (make test depends on setup). HSX_INVENTORY_CONFIGURED= keeps a configured
    # ansible.cfg inventory out of it: the hosts are INVENTORY's, or this machine.
    command = ["make", "-s", "--no-print-directory", "-C", str(MAKE_DIR), "-o", ".venv/.setup-done", target]
    command += ["HSX_INVENTORY_CONFIGURED=", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def check_report(report: dict[str, Any], host: LiveHost) -> None:
    assert report["reachable"] is True, report["error"]
    assert report["health"] == 200
    assert set(report["units"]) == {"hsextract-server", "hsextract-extract"}
    mounts = {fs["mount"] for fs in report["filesystems"]}
    assert "/dev/shm" in mounts
    paths = {fs["path"] for fs in report["filesystems"]}
    assert str(host.output) in paths
    for fs in report["filesystems"]:
        assert fs["size_bytes"] > 0 and 0 <= fs["used_bytes"] <= fs["size_bytes"]
    progress = report["progress"]
    assert progress["running"] is False  # the run finished
    assert progress["server_up"] is True
    assert progress["planned"] == ROWS + 1
    assert progress["settled"] == ROWS + 1
    assert progress["by_status"] == {"ok": ROWS, "bad_input": 1, "failed": 0, "resumed": 0}
    assert progress["errors"] == {"not_json": 1}
    assert progress["tokens"] == progress["tokens_planned"] == host.tokens
    assert progress["elapsed_s"] is not None and progress["elapsed_s"] >= 0  # the extractor process's age (fuser, ps)
    assert progress["eta_s"] == 0


def local_args(host: LiveHost) -> str:
    return (
        f"STATUS_ARGS=--json --server-port {host.server_port} --metrics-port {host.metrics_port} "
        f"--output-dir {host.output} --dump-dir {host.dump_dir}"
    )


def test_make_status_on_this_machine(live_host: LiveHost) -> None:
    done = make_status(local_args(live_host))
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["hosts"]
    assert report["address"] == "this machine"
    check_report(report, live_host)


def test_status_text_report_says_what_the_runbooks_look_at(live_host: LiveHost) -> None:
    done = make_status(local_args(live_host).replace("--json ", ""))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "server health (/health_generate): 200 OK" in text
    assert f"{ROWS + 1}/{ROWS + 1} samples settled (100.0%)" in text
    assert "errors: not_json 1" in text and "/dev/shm" in text and "ETA: 0m 0s" in text


def test_status_when_nothing_runs_says_so(tmp_path: Path) -> None:
    port = free_port()
    nothing = tmp_path / "no-output"  # not the checkout's work/output, whatever `make extract` left there
    done = make_status(f"STATUS_ARGS=--server-port {port} --metrics-port {port} --output-dir {nothing}")
    assert done.returncode == 0, done.stderr
    assert "server health (/health_generate): no answer" in done.stdout
    assert f"no answer on port {port} (the extractor is not running)" in done.stdout
    assert f"output {nothing}: no such directory on this host" in done.stdout


def test_status_without_output_dir_reads_the_checkouts_finished_work_output() -> None:
    port = free_port()
    done = make_status(f"STATUS_ARGS=--server-port {port} --metrics-port {port}")
    assert done.returncode == 0, done.stderr
    assert "extraction: not running; its output's data_config.json says complete" in done.stdout
    assert f"{ROWS + 1}/{ROWS + 1} samples settled (100.0%)" in done.stdout and "no such directory" not in done.stdout


@pytest.fixture(scope="module")
def ansible_venv() -> None:
    """.venv-ansible (ansible-inventory) set up first, so its setup output does not mix into a report."""
    done = subprocess.run(["make", "-s", "-C", str(REPO), "setup-ansible"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def write_inventory(directory: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    directory.mkdir()
    groups = {"extraction_containers": {"hosts": hosts}, "proxmox_hosts": {"hosts": {"pve": {}}}}
    (directory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}))
    return directory


def ssh_host(sshd: SSHServer, host: LiveHost) -> dict[str, Any]:
    return {
        "ansible_host": "127.0.0.1",
        "ansible_port": sshd.port,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(sshd.client_key),
        "hsx_server_port": host.server_port,
        "hsx_metrics_port": host.metrics_port,
        "hsx_output_dir": str(host.output),
        "hsx_dump_dir": str(host.dump_dir),
    }


@pytest.mark.usefixtures("ansible_venv")
def test_make_status_over_ssh_one_connection_per_host(live_host: LiveHost, sshd: SSHServer, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", {"c1": ssh_host(sshd, live_host)})
    done = make_status(f"INVENTORY={inventory}", "STATUS_ARGS=--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["hosts"]
    assert report["name"] == "c1" and report["address"] == "127.0.0.1"
    check_report(report, live_host)
    accepted = sshd.log_path.read_text().count("Accepted publickey")
    assert accepted == 1, f"expected one SSH connection, sshd accepted {accepted}"


@pytest.mark.usefixtures("ansible_venv")
def test_make_logs_over_ssh(live_host: LiveHost, sshd: SSHServer, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", {"c1": ssh_host(sshd, live_host)})
    done = make_status(f"INVENTORY={inventory}", "LINES=5", target="logs")
    assert done.returncode == 0, done.stderr
    assert "== c1 (127.0.0.1)" in done.stdout
    assert "-- last log lines of hsextract-server:" in done.stdout
    assert "-- last log lines of hsextract-extract:" in done.stdout


@pytest.mark.usefixtures("ansible_venv")
def test_status_reports_an_unreachable_host_and_still_reports_the_others(
    live_host: LiveHost, sshd: SSHServer, tmp_path: Path
) -> None:
    closed = free_port()
    hosts = {"c1": ssh_host(sshd, live_host), "gone": {**ssh_host(sshd, live_host), "ansible_port": closed}}
    inventory = write_inventory(tmp_path / "inventory", hosts)
    done = make_status(f"INVENTORY={inventory}")
    assert done.returncode != 0
    assert "StatusError: could not reach gone" in done.stderr
    assert "== gone (127.0.0.1) shard 1/2\n  UNREACHABLE:" in done.stdout and f"127.0.0.1:{closed}" in done.stdout
    assert "== c1 (127.0.0.1) shard 0/2\n  server health (/health_generate): 200 OK" in done.stdout


def test_inventory_without_the_group_is_a_clear_error(ansible_venv: None, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"x": {}}}}))
    done = make_status(f"INVENTORY={inventory}")
    assert done.returncode == 2
    assert "ConfigError: the inventory has no group 'extraction_containers'" in done.stderr


def test_status_commands_are_read_only() -> None:
    target = Target("t")
    for command in ops_status.status_commands(target, log_lines=10).values():
        for word in (" -k", "kill", "rm ", "restart", "systemctl start", "systemctl stop", ">", "tee", "mkdir"):
            assert word not in command.replace("2>/dev/null", "").replace(">/dev/null", ""), (word, command)
