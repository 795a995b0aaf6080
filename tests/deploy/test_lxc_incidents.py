"""The reference (Kimi-K2.5) run's incidents, replayed on the container test_lxc_deploy.py deployed.

1. the server unit started with another interpreter than the ml-env's (a second Python on PATH);
2. a process holding the server port while the container does not answer SSH: make restart goes through
   the Proxmox host (`pct exec`, the stand-in scripts/lxc/pct on this machine);
3. a server that answers /health but not /health_generate: never reported healthy;
4. the container rebooted with `pct reboot`: /dev/shm, NCCL variables and the server come back by themselves,
   and the second deploy.yml run of the session changes nothing.
Runbooks that name these procedures (docs/runbooks/) point here. Tests run in file order; each starts from a
healthy server and puts back what it changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import (
    PORT,
    PROXMOX_HOST,
    SHM_EXPECTED_MB,
    Container,
    assert_nccl_env_of_the_server,
    http_status,
    run_make,
    run_playbook,
    server_main_pid,
    wait_until,
)

ML_ENV = "/opt/ml-env"
DROPIN_DIR = "/etc/systemd/system/hsextract-server.service.d"
UNIT = "hsextract-server.service"


@pytest.fixture
def healthy(deployed: object, container: Container) -> Container:
    """A healthy server at the start of each replay (restarted only when it is not)."""
    if http_status(container) != 200:
        container.run(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}", check=False)
        wait_until(lambda: http_status(container) == 200, 300, "hsextract-server healthy before the replay")
    return container


def _remove_dropin(container: Container, name: str) -> None:
    container.run(f"rm -f {DROPIN_DIR}/{name}; systemctl daemon-reload; systemctl reset-failed {UNIT}; systemctl restart {UNIT}")


def _journal(container: Container, lines: int = 30) -> str:
    return container.run(f"journalctl -u {UNIT} -n {lines} --no-pager -o cat").stdout


# -- 1 -------------------------------------------------------------------------------------------------

SECOND_PYTHON = "/usr/local/bin/python3"
SECOND_PYTHON_MARK = "/run/second-python-ran"
BY_HAND = "50-by-hand.conf"


def test_server_started_with_another_python_is_refused(healthy: Container, inventory: Path) -> None:
    container = healthy
    # A second Python first on PATH that can import the server's packages (the system interpreter with the
    # ml-env's site-packages): a unit running `python3 -m hsextract serve` would start and look fine.
    container.run(
        f"printf '#!/bin/sh\\ntouch {SECOND_PYTHON_MARK}\\n"
        f'PYTHONPATH=$(echo {ML_ENV}/lib/python3*/site-packages) exec /usr/bin/python3 "$@"\\n\' > {SECOND_PYTHON}'
        f" && chmod 0755 {SECOND_PYTHON}"
    )
    try:
        assert container.run("command -v python3").stdout.strip() == SECOND_PYTHON
        assert "/opt/ml-env/lib/" in container.run("python3 -c 'import hsextract; print(hsextract.__file__)'").stdout
        container.run(f"rm -f {SECOND_PYTHON_MARK}")
        # what an operator types: a drop-in that starts the server with `python3`
        command = "python3 -m hsextract serve --config /etc/hsextract/serve.yaml"
        container.run(
            f"printf '[Service]\\nExecStart=\\nExecStart={command}\\n' > {DROPIN_DIR}/{BY_HAND} && systemctl daemon-reload"
        )
        # the unit refuses (its first ExecStartPre), naming the ml-env's interpreter and the drop-in
        start = container.run(f"systemctl restart {UNIT}", check=False)
        assert start.returncode != 0, "the unit started with a hand-made python3 command"
        journal = _journal(container)
        assert f"its ExecStart runs '{command}', not a program of the ml-env {ML_ENV}" in journal, journal
        assert f"interpreter {ML_ENV}/bin/python" in journal and f"{DROPIN_DIR}/{BY_HAND}" in journal, journal
        assert container.run(f"test -e {SECOND_PYTHON_MARK}", check=False).returncode != 0, "the second python ran"
        assert container.run(f"fuser -n tcp {PORT}", check=False).returncode != 0, "something serves the port"
        # make restart refuses before it stops anything
        result = run_playbook("playbooks/restart.yml", inventory)
        assert result.rc != 0
        assert f"not a program of the ml-env {ML_ENV} (interpreter {ML_ENV}/bin/python)" in result.flat
        assert "TASK [Stop hsextract-server]" not in result.flat
        # deploy.yml's preflight refuses the drop-in (deploy would restart the server with it)
        result = run_playbook("deploy.yml", inventory, "--tags", "hsx_server_preflight")
        assert result.rc != 0
        assert f"{DROPIN_DIR}/{BY_HAND} replaces" in result.flat
        assert f"the ml-env's interpreter {ML_ENV}/bin/python" in result.flat
    finally:
        container.run(f"rm -f {SECOND_PYTHON} {SECOND_PYTHON_MARK}")
        _remove_dropin(container, BY_HAND)


def test_ml_env_pointing_at_the_system_python_is_refused(deployed: object, inventory: Path, container: Container) -> None:
    """hsx_ml_env: /usr would make /usr/bin/python the server's interpreter (and a venv over /usr)."""
    result = run_playbook("deploy.yml", inventory, "--tags", "hsx_container_env_preflight", "-e", '{"hsx_ml_env": "/usr"}')
    assert result.rc != 0
    assert "hsx_ml_env /usr holds bin/ but no pyvenv.cfg: it is a Python installation" in result.flat
    assert container.run("test -e /usr/pyvenv.cfg", check=False).returncode != 0


# -- 3 -------------------------------------------------------------------------------------------------

HALF_READY = "50-half-ready.conf"


def test_server_answering_health_but_not_health_generate_is_never_healthy(healthy: Container, inventory: Path) -> None:
    container = healthy
    script = (Path(__file__).parent / "half_ready_server.py").read_text()
    container.run(f"mkdir -p /opt/hsx-test && cat > /opt/hsx-test/half_ready_server.py <<'EOF'\n{script}EOF")
    container.run(
        f"printf '[Service]\\nExecStart=\\nExecStart={ML_ENV}/bin/python /opt/hsx-test/half_ready_server.py {PORT}\\n'"
        f" > {DROPIN_DIR}/{HALF_READY} && systemctl daemon-reload"
    )
    try:
        result = run_playbook(
            "playbooks/restart.yml", inventory, "-e", '{"hsx_server_health_timeout_s": 5, "hsx_server_health_delay_s": 1}'
        )
        assert result.rc != 0, "restart.yml reported a server that never answers /health_generate as healthy"
        assert "answered HTTP 200" not in result.flat
        assert f"http://127.0.0.1:{PORT}/health_generate did not answer HTTP 200 within 5 s (last status 503" in result.flat
        # the journal tail is printed: the unit's own lines, with the probes of /health_generate
        assert "loading model weights (this stand-in never finishes)" in result.flat
        assert "GET /health_generate -> 503, model weights still loading" in result.flat
        # the stimulus: /health said 200 all along
        assert http_status(container, "/health") == 200
        assert http_status(container, "/health_generate") == 503
    finally:
        _remove_dropin(container, HALF_READY)


# -- 2 -------------------------------------------------------------------------------------------------


def test_restart_escalates_through_pct_when_ssh_is_down(healthy: Container, inventory: Path) -> None:
    container = healthy
    container.run(f"systemctl stop {UNIT}")
    container.run(f"setsid nohup python3 -m http.server {PORT} >/dev/null 2>&1 < /dev/null & echo started")
    wait_until(lambda: container.run(f"fuser -n tcp {PORT}", check=False).returncode == 0, 30, "the stray holds the port")
    stray_pid = int(container.run(f"fuser -n tcp {PORT} 2>/dev/null").stdout.split()[0])
    # SSH down: the daemon stopped, and every SSH connection (Ansible's persistent ones too) killed
    container.pct("exec", "--", "sh", "-c", "systemctl stop ssh.service; fuser -k -n tcp 22; true")
    try:
        assert not container.answers_ssh(), "SSH still answers"
        calls_before = len(container.pct_calls())
        result = run_make("restart", inventory)
        assert result.rc == 0, result.output[-8000:]
        vmid = container.vmid
        escalated = f"did not answer SSH within 10 s: restarted through its Proxmox host {PROXMOX_HOST} with pct exec {vmid}"
        assert escalated in result.flat
        assert f"port {PORT}: killed (fuser -k): {stray_pid} python3 -m http.server {PORT}" in result.flat
        assert f"restarted hsextract-server.service; http://127.0.0.1:{PORT}/health_generate answered HTTP 200" in result.flat
        calls = container.pct_calls()[calls_before:]
        assert calls[0] == f"status {vmid}", calls
        assert f"exec {vmid} -- fuser -k -n tcp {PORT}" in calls, calls
        assert f"exec {vmid} -- systemctl restart {UNIT}" in calls, calls
        # checked through pct too: SSH is still down
        assert not container.answers_ssh()
        assert container.pct("exec", "--", "kill", "-0", str(stray_pid), check=False).returncode != 0, "the stray survived"
        assert container.pct("exec", "--", "systemctl", "is-active", UNIT).stdout.strip() == "active"
        assert http_status(container, via_pct=True) == 200
        main_pid = container.pct("exec", "--", "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
        holders = container.pct("exec", "--", "fuser", "-n", "tcp", str(PORT)).stdout.split()
        assert holders == [main_pid], (holders, main_pid)
    finally:
        container.pct("exec", "--", "systemctl", "start", "ssh.service")
        wait_until(container.answers_ssh, 60, "SSH answers again")


# -- 4 -------------------------------------------------------------------------------------------------


def test_after_pct_reboot_shm_nccl_and_the_server_come_back(healthy: Container) -> None:
    container = healthy
    container.run("touch /run/hsx-before-reboot")
    pid_before = server_main_pid(container)
    container.pct("reboot")
    wait_until(container.answers_ssh, 120, "SSH after pct reboot")
    assert container.run("test -e /run/hsx-before-reboot", check=False).returncode != 0, "the container did not reboot"
    # nobody touches it: the enabled unit starts at boot and becomes healthy by itself
    wait_until(lambda: http_status(container) == 200, 300, "hsextract-server healthy after the reboot, by itself")
    assert server_main_pid(container) != pid_before
    # /dev/shm: the container's LXC config still says 64 MiB (the stand-in does not apply /etc/pve), so the size
    # comes from the guest's own /etc/fstab line
    lxc_config = Path(container.pct_path).parent.parent / "lxc" / container.name / "config"
    assert "size=64m" in lxc_config.read_text()
    size = int(container.run("findmnt -bno SIZE /dev/shm").stdout.strip())
    assert size == SHM_EXPECTED_MB * 1024 * 1024, f"/dev/shm is {size} bytes after the reboot"
    assert_nccl_env_of_the_server(container)


def test_second_deploy_after_the_incidents_and_the_reboot_changes_nothing(
    deployed: object, container: Container, inventory: Path
) -> None:
    calls_before = container.pct_calls()
    result = run_playbook("deploy.yml", inventory)
    assert result.rc == 0, result.output[-8000:]
    assert result.recap()["lxc-test"]["changed"] == 0, "second run changed something:\n" + "\n".join(
        line for line in result.output.splitlines() if line.startswith("changed:")
    )
    assert container.pct_calls() == calls_before, "an unchanged Proxmox config made deploy.yml call pct"
