"""Shared code of the deployment tests: a real LXC system container and ansible-playbook runs against it.

Run with the Ansible venv's interpreter (make test-deploy): .venv-ansible/bin/python -m pytest tests/deploy
The container is built by scripts/lxc/testbed.sh and removed in the session finalizer, also on failure.
This machine is also the container's "Proxmox host": a local-connection host whose `pct` is the stand-in
scripts/lxc/pct, and whose /etc/pve/lxc is a scratch directory. One deploy.yml run (fixture `deployed`)
serves test_lxc_deploy.py and then test_lxc_incidents.py, in that order.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_BIN = Path(sys.executable).parent
TESTBED = REPO / "scripts" / "lxc" / "testbed.sh"

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class PlaybookResult:
    rc: int
    output: str

    @property
    def flat(self) -> str:
        """The output with whitespace runs made one space and YAML's doubled quotes undone: messages the YAML
        callback wrapped over lines compare as written."""
        return " ".join(self.output.split()).replace("''", "'")

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
    return _run(argv, ansible_env(), timeout)


def run_make(target: str, inventory: Path, *args: str, timeout: int = 1800) -> PlaybookResult:
    """``make <target> INVENTORY=...`` as an operator types it, with this session's Ansible venv; `args` go to make
    before the target (options, VARIABLE=value)."""
    env = {k: v for k, v in ansible_env().items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    argv = ["make", "--no-print-directory", *args, target, f"INVENTORY={inventory}", f"ANSIBLE_VENV={ANSIBLE_BIN.parent}"]
    return _run(argv, env, timeout)


def _run(argv: list[str], env: dict[str, str], timeout: int) -> PlaybookResult:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    print(f"$ {shlex.join(argv)}  (rc {proc.returncode}, {time.monotonic() - started:.0f} s)\n" + output[-6000:])
    return PlaybookResult(proc.returncode, output)


def wait_until(condition: Callable[[], bool], deadline_s: float, what: str, every_s: float = 1.0) -> None:
    """Poll until condition() holds; fail naming `what` when the deadline passes (a hang guard, not a speed check)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {deadline_s:.0f} s")
        time.sleep(every_s)


@dataclass
class Container:
    name: str
    ip: str
    key: str
    wheelhouse: str
    vmid: int
    #: the `pct` stand-in (scripts/lxc/pct, wrapped for this container) and the log of its calls
    pct_path: str
    pct_log: Path

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

    def answers_ssh(self) -> bool:
        return self.run("true", check=False, timeout=30).returncode == 0

    def pct(self, *args: str, check: bool = True, timeout: int = 180) -> subprocess.CompletedProcess[str]:
        """The pct stand-in on this machine (the container's "Proxmox host"), e.g. pct("exec", "--", "ls")."""
        argv = [self.pct_path, args[0], str(self.vmid), *args[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def pct_calls(self) -> list[str]:
        return self.pct_log.read_text().splitlines() if self.pct_log.exists() else []


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
    return Container(
        info["HSX_LXC_NAME"], info["HSX_LXC_IP"], info["HSX_LXC_KEY"], info["HSX_LXC_WHEELHOUSE"],
        int(info["HSX_LXC_VMID"]), info["HSX_LXC_PCT"], Path(info["HSX_LXC_PCT_LOG"]),
    )  # fmt: skip


#: what the test deploys: the embedded runtime, a tiny model, a small sample dataset, offline pip
TEST_SETTINGS = {
    "hsx_runtime": "embedded",
    "hsx_ml_env": "/opt/ml-env",
    "hsx_model_path": "/opt/hsextract/model",
    "hsx_dataset": "/opt/hsextract/data.jsonl",
    "hsx_output_dir": "/var/lib/hsextract/output",
    "hsx_tp_size": 1,
    "hsx_gpu_count": 0,
    # the Proxmox side runs on this machine (host pve-test): a scratch /etc/pve/lxc and the pct stand-in
    "hsx_proxmox_manage": True,
    # make restart's escalation gives SSH this long before it goes through pct
    "hsx_restart_ssh_timeout_s": 10,
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
#: what the roles add to a /dev/shm mount where the kernel has huge pages for tmpfs (this machine's: the tests' Proxmox
#: host and containers share its kernel); docs/deploy.md#devshm-size
SHM_HUGE = ",huge=within_size" if Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").exists() else ""
PROXMOX_HOST = "pve-test"
PORT = 30000


def pve_conf(container: Container) -> str:
    """The container's config as its Proxmox host would hold it, before deploy.yml (the /dev/shm entry as testbed.sh sets it)."""
    return (
        f"arch: amd64\ncores: 2\nhostname: {container.name}\nmemory: 4096\n"
        f"net0: name=eth0,bridge=vmbr0,ip={container.ip}/30,type=veth\nostype: debian\n"
        f"rootfs: local:{container.vmid}/vm-{container.vmid}-disk-0.raw,size=8G\nswap: 0\n"
        "lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=64M,create=dir 0 0\n"
    )


@pytest.fixture(scope="session")
def inventory(container: Container, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the inventory directory holds only inventory files (Ansible reads every file in it); beside it the source
    # snapshot and the scratch /etc/pve/lxc of the Proxmox host
    root = tmp_path_factory.mktemp("deploy")
    inventory = root / "inventory"
    inventory.mkdir()
    example = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    # a snapshot of the source: an edit in the work tree during the session must not make the second run change
    shutil.copytree(REPO / "extractor", root / "extractor", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "constraints.txt", root / "constraints.txt")
    pve_dir = root / "pve-lxc"
    pve_dir.mkdir()
    (pve_dir / f"{container.vmid}.conf").write_text(pve_conf(container))
    settings = {
        **example,
        **TEST_SETTINGS,
        "hsx_container_env_pip_args": ["--no-index", "--find-links", container.wheelhouse],
        "hsx_container_env_hsextract_src": str(root / "extractor"),
        "hsx_container_env_constraints": str(root / "constraints.txt"),
        "hsx_proxmox_pct": container.pct_path,
        "hsx_proxmox_lxc_config_dir": str(pve_dir),
    }
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    hosts = {
        "all": {
            "children": {
                "proxmox_hosts": {
                    "hosts": {
                        PROXMOX_HOST: {"ansible_connection": "local", "ansible_python_interpreter": str(ANSIBLE_BIN / "python")}
                    }
                },
                "extraction_containers": {
                    "hosts": {
                        "lxc-test": {
                            "ansible_host": container.ip,
                            "ansible_ssh_private_key_file": container.key,
                            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                            "hsx_proxmox_host": PROXMOX_HOST,
                            "hsx_vmid": container.vmid,
                        }
                    }
                },
            }
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return inventory


@pytest.fixture(scope="session")
def deployed(container: Container, inventory: Path) -> PlaybookResult:
    """The first deploy.yml run of the session (the tests after it share its container and server)."""
    result = run_playbook("deploy.yml", inventory)
    assert result.rc == 0, "deploy.yml failed:\n" + result.output[-8000:]
    recap = result.recap()
    assert recap["lxc-test"]["failed"] == 0 and recap["lxc-test"]["changed"] > 0, recap
    return result


def server_main_pid(container: Container) -> int:
    pid = int(container.run("systemctl show -p MainPID --value hsextract-server.service").stdout.strip())
    assert pid > 0, "hsextract-server has no main process"
    return pid


#: prints the HTTP status of a GET of argv[1] from inside the container, -1 when nothing answers
PROBE = (
    "import sys, urllib.error, urllib.request\n"
    "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=30).status)\n"
    "except urllib.error.HTTPError as e:\n print(e.code)\n"
    "except Exception:\n print(-1)\n"
)


def http_status(container: Container, path: str = "/health_generate", via_pct: bool = False) -> int:
    """Status of GET http://127.0.0.1:PORT<path> in the container; -1 when nothing answers, -2 when SSH does not."""
    url = f"http://127.0.0.1:{PORT}{path}"
    if via_pct:
        proc = container.pct("exec", "--", "python3", "-c", PROBE, url, check=False)
    else:
        proc = container.run(f"python3 -c {shlex.quote(PROBE)} {url}", check=False)
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else -2


def assert_nccl_env_of_the_server(container: Container) -> None:
    """The NCCL dictionary (hsx_nccl_env) in the running server's /proc/<pid>/environ and in /etc/environment."""
    nccl = yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())["hsx_nccl_env"]
    assert nccl, "inventory/example has no hsx_nccl_env"
    environ = container.run(f"tr '\\0' '\\n' < /proc/{server_main_pid(container)}/environ").stdout.splitlines()
    etc_environment = container.run("cat /etc/environment").stdout.splitlines()
    for key, value in nccl.items():
        assert f"{key}={value}" in environ, f"{key}={value} not in the server's environment: {environ}"
        assert f"{key}={value}" in etc_environment, f"{key}={value} not in /etc/environment"
