"""deploy.yml creates a missing container: ``pct create`` through the stand-in scripts/lxc/pct, which makes a real LXC
container from a template (the cached bookworm rootfs) and renders its LXC config from ``<vmid>.conf`` at every
start, as pve-container does.

Only the Proxmox side runs (``--tags hsx_proxmox_lxc``; the container side is test_lxc_deploy.py's): VMID 195 does
not exist, so the role creates it with the inventory's settings (cores, memory, swap, rootfs, net0, privileged,
features, a read-only model store, root's SSH key), the model's hidden size is read on the Proxmox host through that
mount (``hsx_hidden_size: 0``), the /dev/shm line goes into the new config and the container starts. Checked from
outside: the config's lines, the pct calls, SSH into the new container, its /dev/shm size and read-only model store;
the second run reports changed=0 and calls no pct; the same VMID asked for unprivileged is refused, naming the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .helpers import ANSIBLE_BIN, REPO, SHM_HUGE, TESTBED, Container, PlaybookResult, _require_host, run_playbook, wait_until

NAME, NET, VMID = "hsx-create-test", "10.197.95", 195
HOST = "lxc-create"
SHM_MB = 256  # 4 x 1024 x (3 + 1) x 128 x 2 bytes x 2.0 = 8 MiB: the floor, hsx_shm_min_mb
MODEL_IN_CONTAINER = "/srv/models/tiny"


@pytest.fixture(scope="module")
def pct_host(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    _require_host()
    env = {**os.environ, "HSX_LXC_NAME": NAME, "HSX_LXC_DIR": f"/var/tmp/{NAME}"}
    request.addfinalizer(lambda: subprocess.run([str(TESTBED), "down"], env=env, check=False))
    proc = subprocess.run([str(TESTBED), "pct-host"], env=env, capture_output=True, text=True, timeout=900)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"testbed.sh pct-host failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    yield dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def inventory(pct_host: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("create")
    store = root / "models"
    (store / "tiny").mkdir(parents=True)
    (store / "tiny" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 128}))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "id_ed25519")], check=True)
    example = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    settings = {
        **example,
        "hsx_runtime": "embedded", "hsx_model_path": MODEL_IN_CONTAINER, "hsx_dataset": "/opt/hsextract/data.jsonl",
        "hsx_output_dir": "/var/lib/hsextract/output", "hsx_gpu_count": 0, "hsx_tp_size": 1,
        "hsx_concurrency": 4, "hsx_max_seq_len": 1024, "hsx_hidden_size": 0, "hsx_shm_min_mb": SHM_MB,
        "hsx_proxmox_pct": pct_host["HSX_PCT"],
        "hsx_proxmox_lxc_config_dir": pct_host["HSX_PCT_CONF_DIR"],
        "hsx_proxmox_lxc_template": pct_host["HSX_PCT_TEMPLATE"],
        "hsx_proxmox_lxc_cores": 2, "hsx_proxmox_lxc_memory_mb": 4096, "hsx_proxmox_lxc_swap_mb": 0,
        "hsx_proxmox_lxc_rootfs_storage": "local-lvm", "hsx_proxmox_lxc_rootfs_size_gb": 8,
        "hsx_proxmox_lxc_features": ["keyctl=1"],
        "hsx_proxmox_lxc_mounts": [{"host": str(store), "path": "/srv/models", "ro": True}],
        "hsx_proxmox_lxc_ssh_public_keys": str(root / "id_ed25519.pub"),
    }  # fmt: skip
    inventory = root / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    python = str(ANSIBLE_BIN / "python")
    container = {
        "ansible_host": f"{NET}.2", "ansible_ssh_private_key_file": str(root / "id_ed25519"),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "hsx_proxmox_host": "pve-test", "hsx_vmid": VMID,
        "hsx_proxmox_lxc_net0": f"name=eth0,bridge=vmbr0,ip={NET}.2/30,gw={NET}.1",
    }  # fmt: skip
    groups = {
        "proxmox_hosts": {"hosts": {"pve-test": {"ansible_connection": "local", "ansible_python_interpreter": python}}},
        "extraction_containers": {"hosts": {HOST: container}},
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=False))
    return inventory


@pytest.fixture(scope="module")
def created(pct_host: dict[str, str], inventory: Path) -> PlaybookResult:
    assert not (Path(pct_host["HSX_PCT_CONF_DIR"]) / f"{VMID}.conf").exists()
    result = run_playbook("deploy.yml", inventory, "--tags", "hsx_proxmox_lxc")
    assert result.rc == 0, result.output[-8000:]
    return result


def _container(inventory: Path) -> Container:
    key = str(inventory.parent / "id_ed25519")
    return Container(NAME, f"{NET}.2", key, "", VMID, "", Path("/nonexistent"))


def test_deploy_creates_the_missing_container(created: PlaybookResult, pct_host: dict[str, str], inventory: Path) -> None:
    conf = (Path(pct_host["HSX_PCT_CONF_DIR"]) / f"{VMID}.conf").read_text().splitlines()
    store = inventory.parent / "models"
    for line in (
        "cores: 2", "memory: 4096", "swap: 0", f"hostname: {HOST}", "features: keyctl=1", "ostype: debian",
        f"mp0: {store},mp=/srv/models,ro=1", f"rootfs: local-lvm:vm-{VMID}-disk-0,size=8G",
        # the hidden size (128) came from the model's config.json on this "Proxmox host", through the mount
        f"lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={SHM_MB}M{SHM_HUGE},create=dir 0 0",
    ):  # fmt: skip
        assert line in conf, f"{line!r} not in {conf}"
    assert any(line.startswith(f"net0: name=eth0,bridge=vmbr0,gw={NET}.1,hwaddr=") for line in conf), conf
    assert not any(line.startswith("unprivileged:") for line in conf), "privileged, as hsx_proxmox_lxc_unprivileged says"
    calls = [line.split()[0] for line in Path(pct_host["HSX_PCT_LOG"]).read_text().splitlines()]
    assert calls == ["create", "status", "start"], calls

    container = _container(inventory)
    wait_until(container.answers_ssh, 90, f"SSH into the created container {NET}.2")
    assert container.run("hostname").stdout.strip() == HOST
    size = int(container.run("findmnt -bno SIZE /dev/shm").stdout.strip())
    assert size == SHM_MB * 1024 * 1024, f"/dev/shm is {size} bytes: the config's tmpfs line did not apply"
    assert "hidden_size" in container.run(f"cat {MODEL_IN_CONTAINER}/config.json").stdout
    touch = container.run("touch /srv/models/x", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr, touch


def test_second_run_changes_nothing(created: PlaybookResult, pct_host: dict[str, str], inventory: Path) -> None:
    log = Path(pct_host["HSX_PCT_LOG"])
    calls = log.read_text()
    result = run_playbook("deploy.yml", inventory, "--tags", "hsx_proxmox_lxc")
    assert result.rc == 0, result.output[-8000:]
    assert result.recap()[HOST]["changed"] == 0, result.recap()
    assert log.read_text() == calls, "the second run called pct"


def test_an_existing_container_in_the_other_mode_is_refused(created: PlaybookResult, inventory: Path) -> None:
    result = run_playbook("deploy.yml", inventory, "--tags", "hsx_proxmox_lxc", "-e", "hsx_proxmox_lxc_unprivileged=true")
    assert result.rc != 0
    for words in (f"Container {VMID} ({HOST}) exists and is privileged", "give hsx_vmid a free VMID"):
        assert words in result.flat, words
