"""deploy.yml, restart.yml and extract.yml against a real LXC system container (embedded runtime, tiny model).

The tests run in file order and share one container and one deployment (conftest's `deployed`); the second
deploy.yml run, which must change nothing, is the last test of test_lxc_incidents.py (after a reboot).
"""

from __future__ import annotations

import json
import re
import time

from .helpers import (
    PORT,
    SHM_EXPECTED_MB,
    SHM_HUGE,
    TEST_SETTINGS,
    Container,
    assert_nccl_env_of_the_server,
    http_status,
    pve_conf,
    run_playbook,
    server_main_pid,
)


def test_deploy_ends_with_instructions(deployed):
    assert "make extract" in deployed.output
    assert "/metrics" in deployed.output


def test_proxmox_side_wrote_the_config_and_rebooted_through_pct(deployed, container, inventory):
    conf = (inventory.parent / "pve-lxc" / f"{container.vmid}.conf").read_text().splitlines()
    want = f"lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={SHM_EXPECTED_MB}M{SHM_HUGE},create=dir 0 0"
    assert conf == [line for line in pve_conf(container).splitlines() if "dev/shm" not in line] + [want]
    # the handler asked pct (the stand-in: lxc-info, lxc-stop + lxc-start) and the container really rebooted
    assert container.pct_calls() == [f"status {container.vmid}", f"reboot {container.vmid}"]


def test_unit_is_active_and_runs_the_ml_env(deployed, container):
    assert container.run("systemctl is-active hsextract-server.service").stdout.strip() == "active"
    exec_start = container.run("systemctl show -p ExecStart --value hsextract-server.service").stdout
    assert "path=/opt/ml-env/bin/hsextract" in exec_start, exec_start
    assert "serve --config /etc/hsextract/serve.yaml" in exec_start, exec_start
    pre = container.run("systemctl show -p ExecStartPre --value hsextract-server.service").stdout
    assert f"/usr/bin/fuser -k -n tcp {PORT}" in pre, pre
    assert pre.index("/usr/local/lib/hsextract/hsextract-server-check") < pre.index("/usr/bin/fuser"), pre
    cmdline = container.run(f"tr '\\0' '\\n' < /proc/{server_main_pid(container)}/cmdline").stdout.split("\n")
    assert cmdline[0].startswith("/opt/ml-env/bin/python"), cmdline
    assert cmdline[1:3] == ["/opt/ml-env/bin/hsextract", "serve"], cmdline


def test_nccl_variables_reach_the_server_process(deployed, container):
    assert_nccl_env_of_the_server(container)


def test_dev_shm_has_the_size_and_huge_pages_asked(deployed, container):
    size, options = container.run("findmnt -bno SIZE,FS-OPTIONS /dev/shm").stdout.split()
    assert int(size) == SHM_EXPECTED_MB * 1024 * 1024, f"/dev/shm is {size} bytes"
    assert SHM_HUGE.lstrip(",") in options.split(","), options  # the testbed mounted it without: remounted live
    fstab = container.run("cat /etc/fstab").stdout
    assert f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={SHM_EXPECTED_MB}M{SHM_HUGE} 0 0" in fstab.splitlines()


def test_health_generate_answers_200(deployed, container):
    assert http_status(container) == 200


def test_restart_reclaims_a_port_held_by_a_stray_process(deployed, container, inventory):
    container.run("systemctl stop hsextract-server.service")
    container.run(f"setsid nohup python3 -m http.server {PORT} >/dev/null 2>&1 < /dev/null & echo started")
    stray = ""
    for _ in range(50):
        stray = container.run(f"fuser -n tcp {PORT} 2>/dev/null", check=False).stdout.strip()
        if stray:
            break
        time.sleep(0.2)
    assert stray, f"the stray process never held port {PORT}"
    stray_pid = int(stray.split()[0])
    pct_calls = container.pct_calls()
    result = run_playbook("playbooks/restart.yml", inventory)
    assert result.rc == 0, result.output[-8000:]
    # SSH answers: the plain path, no pct; and it says what it killed
    assert container.pct_calls() == pct_calls, "restart.yml went through pct although SSH answered"
    assert "restarted hsextract-server over SSH (the plain path" in result.flat
    assert f"killed by the unit's ExecStartPre (fuser -k): {stray_pid} python3 -m http.server {PORT}" in result.flat
    assert container.run(f"kill -0 {stray_pid}", check=False).returncode != 0, "the stray process survived the restart"
    assert container.run("systemctl is-active hsextract-server.service").stdout.strip() == "active"
    assert http_status(container) == 200
    holder = int(container.run(f"fuser -n tcp {PORT} 2>/dev/null").stdout.split()[0])
    assert holder == server_main_pid(container)


def test_extraction_in_the_container_verifies(deployed, container, inventory):
    result = run_playbook("playbooks/extract.yml", inventory, "-e", "hsx_extract_wait=true")
    assert result.rc == 0, result.output[-8000:]
    output = str(TEST_SETTINGS["hsx_output_dir"])
    verify = container.run(f"/opt/ml-env/bin/hsextract verify {output}", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    config = json.loads(container.run(f"cat {output}/data_config.json").stdout)
    assert config["total_samples"] + _bad_rows(container, output) == TEST_SETTINGS["hsx_extractor_sample_rows"]
    assert config["total_samples"] > 0


def _bad_rows(container: Container, output: str) -> int:
    text = container.run(f"cat {output}/errors.jsonl 2>/dev/null || true").stdout
    return len([line for line in text.splitlines() if re.search(r"\S", line)])
