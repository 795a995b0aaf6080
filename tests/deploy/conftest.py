"""Fixtures of the deployment tests: a real LXC system container and ansible-playbook runs against it.

Run with the Ansible venv's interpreter (make test-deploy): .venv-ansible/bin/python -m pytest tests/deploy
The container is built by scripts/lxc/testbed.sh and removed in the session finalizer, also on failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_BIN = Path(sys.executable).parent
TESTBED = REPO / "scripts" / "lxc" / "testbed.sh"
# Collected only by the Ansible venv's interpreter (make test-deploy); `make test` with .venv skips the directory.
if not (ANSIBLE_BIN / "ansible-playbook").exists():
    collect_ignore_glob = ["test_*.py"]

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class PlaybookResult:
    rc: int
    output: str

    def recap(self) -> dict[str, dict[str, int]]:
        return {
            m.group(1): {
                "ok": int(m.group(2)),
                "changed": int(m.group(3)),
                "unreachable": int(m.group(4)),
                "failed": int(m.group(5)),
            }
            for m in RECAP.finditer(self.output)
        }


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_LOCAL_TEMP=str(Path(os.environ.get("TMPDIR", "/tmp")) / "hsx-ansible-local"),
        PATH=f"{ANSIBLE_BIN}:{env.get('PATH', '')}",
    )
    return env


def run_playbook(playbook: str, inventory: Path | None, *args: str, timeout: int = 1800) -> PlaybookResult:
    argv = [str(ANSIBLE_BIN / "ansible-playbook"), playbook, *args]
    if inventory is not None:
        argv[1:1] = ["-i", str(inventory)]
    proc = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    print(f"$ {shlex.join(argv)}  (rc {proc.returncode})\n" + output[-6000:])
    return PlaybookResult(proc.returncode, output)


@dataclass
class Container:
    name: str
    ip: str
    key: str
    wheelhouse: str

    def ssh_argv(self, command: str) -> list[str]:
        return [
            "ssh", "-i", self.key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{self.ip}", command,
        ]  # fmt: skip

    def run(self, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.ssh_argv(command), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"in the container: {command!r} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc


def _require_host() -> None:
    if os.geteuid() != 0:
        pytest.skip("the LXC deployment test needs root (it creates a container and a veth)")
    for tool in ("lxc-start", "debootstrap", "ssh"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/lxc/install-host-deps.sh (make test-deploy does)")


@pytest.fixture(scope="session")
def container(request: pytest.FixtureRequest) -> Container:
    _require_host()
    env = dict(os.environ)
    env.setdefault("HSX_LXC_NAME", "hsx-deploy-test")
    env.setdefault("HSX_LXC_DIR", f"/var/tmp/{env['HSX_LXC_NAME']}")
    env.setdefault("HSX_HOST_PIP", str(REPO / ".venv" / "bin" / "pip"))

    def down() -> None:
        subprocess.run([str(TESTBED), "down"], env=env, check=False)

    request.addfinalizer(down)
    proc = subprocess.run([str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=900)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"testbed.sh up failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    info = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return Container(info["HSX_LXC_NAME"], info["HSX_LXC_IP"], info["HSX_LXC_KEY"], info["HSX_LXC_WHEELHOUSE"])


#: what the test deploys: the embedded runtime, a tiny model, a small sample dataset, offline pip
TEST_SETTINGS = {
    "hsx_runtime": "embedded",
    "hsx_ml_env": "/opt/ml-env",
    "hsx_model_path": "/opt/hsextract/model",
    "hsx_dataset": "/opt/hsextract/data.jsonl",
    "hsx_output_dir": "/var/lib/hsextract/output",
    "hsx_tp_size": 1,
    "hsx_gpu_count": 0,
    "hsx_proxmox_manage": False,
    # dump budget: 4 x 1024 x 4 x 128 x 2 x 2 = 8 MiB, so the floor (256 MiB) wins; the container starts with 64 MiB
    "hsx_concurrency": 4,
    "hsx_max_seq_len": 1024,
    "hsx_hidden_size": 128,
    "hsx_shm_min_mb": 256,
    "hsx_shm_size_mb": 0,
    "hsx_container_env_torch_spec": "torch==2.13.0",
    "hsx_server_make_tiny_model": True,
    "hsx_server_health_timeout_s": 300,
    "hsx_server_health_delay_s": 2,
    "hsx_extractor_make_sample_data": True,
    "hsx_extractor_sample_rows": 16,
}
SHM_EXPECTED_MB = 256


@pytest.fixture(scope="session")
def inventory(container: Container, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inventory")
    example = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    # a snapshot of the source: an edit in the work tree during the session must not make the second run change
    shutil.copytree(REPO / "extractor", root / "extractor", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "constraints.txt", root / "constraints.txt")
    settings = {
        **example,
        **TEST_SETTINGS,
        "hsx_container_env_pip_args": ["--no-index", "--find-links", container.wheelhouse],
        "hsx_container_env_hsextract_src": str(root / "extractor"),
        "hsx_container_env_constraints": str(root / "constraints.txt"),
    }
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    hosts = {
        "all": {
            "children": {
                "proxmox_hosts": {"hosts": {}},
                "extraction_containers": {
                    "hosts": {
                        "lxc-test": {
                            "ansible_host": container.ip,
                            "ansible_ssh_private_key_file": container.key,
                            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                            "hsx_proxmox_host": "none",
                            "hsx_vmid": 0,
                        }
                    }
                },
            }
        }
    }
    (root / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return root
