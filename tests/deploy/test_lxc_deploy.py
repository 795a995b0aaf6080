"""deploy.yml, restart.yml and extract.yml against a real LXC system container (embedded runtime, tiny model).

The tests run in file order and share one container and one deployment.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from .conftest import SHM_EXPECTED_MB, TEST_SETTINGS, Container, run_playbook

PORT = 30000


@pytest.fixture(scope="module")
def deployed(container, inventory):
    started = time.monotonic()
    result = run_playbook("deploy.yml", inventory)
    assert result.rc == 0, "deploy.yml failed:\n" + result.output[-8000:]
    recap = result.recap()
    assert recap["lxc-test"]["failed"] == 0 and recap["lxc-test"]["changed"] > 0, recap
    print(f"first deploy.yml run: {time.monotonic() - started:.0f} s")
    return result


def _main_pid(container: Container) -> int:
    pid = int(container.run("systemctl show -p MainPID --value hsextract-server.service").stdout.strip())
    assert pid > 0, "hsextract-server has no main process"
    return pid


def _health(container: Container) -> int:
    probe = (
        "python3 -c 'import urllib.request as u, sys\n"
        'try:\n print(u.urlopen("http://127.0.0.1:%d/health_generate", timeout=30).status)\n'
        'except Exception as e:\n print(getattr(e, "code", -1))\''.replace("%d", str(PORT))
    )
    return int(container.run(probe).stdout.strip())


def test_deploy_ends_with_instructions(deployed):
    assert "make extract" in deployed.output
    assert "/metrics" in deployed.output


def test_second_deploy_changes_nothing(deployed, inventory):
    result = run_playbook("deploy.yml", inventory)
    assert result.rc == 0, result.output[-8000:]
    assert result.recap()["lxc-test"]["changed"] == 0, "second run changed something:\n" + "\n".join(
        line for line in result.output.splitlines() if line.startswith("changed:")
    )


def test_unit_is_active_and_runs_the_ml_env(deployed, container):
    assert container.run("systemctl is-active hsextract-server.service").stdout.strip() == "active"
    exec_start = container.run("systemctl show -p ExecStart --value hsextract-server.service").stdout
    assert "path=/opt/ml-env/bin/hsextract" in exec_start, exec_start
    assert "serve --config /etc/hsextract/serve.yaml" in exec_start, exec_start
    pre = container.run("systemctl show -p ExecStartPre --value hsextract-server.service").stdout
    assert f"/usr/bin/fuser -k -n tcp {PORT}" in pre, pre
    cmdline = container.run(f"tr '\\0' '\\n' < /proc/{_main_pid(container)}/cmdline").stdout.split("\n")
    assert cmdline[0].startswith("/opt/ml-env/bin/python"), cmdline
    assert cmdline[1:3] == ["/opt/ml-env/bin/hsextract", "serve"], cmdline


def test_nccl_variables_reach_the_server_process(deployed, container):
    environ = container.run(f"tr '\\0' '\\n' < /proc/{_main_pid(container)}/environ").stdout.splitlines()
    for key, value in TEST_SETTINGS.get("hsx_nccl_env", {}).items() or _example_nccl().items():
        assert f"{key}={value}" in environ, f"{key}={value} not in the server's environment: {environ}"
    etc_environment = container.run("cat /etc/environment").stdout
    for key, value in _example_nccl().items():
        assert f"{key}={value}" in etc_environment.splitlines()


def _example_nccl() -> dict[str, str]:
    import yaml

    from .conftest import REPO

    return yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())["hsx_nccl_env"]


def test_dev_shm_has_the_size_asked(deployed, container):
    size = int(container.run("findmnt -bno SIZE /dev/shm").stdout.strip())
    assert size == SHM_EXPECTED_MB * 1024 * 1024, f"/dev/shm is {size} bytes"
    fstab = container.run("cat /etc/fstab").stdout
    assert f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={SHM_EXPECTED_MB}M 0 0" in fstab.splitlines()


def test_health_generate_answers_200(deployed, container):
    assert _health(container) == 200


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
    result = run_playbook("playbooks/restart.yml", inventory)
    assert result.rc == 0, result.output[-8000:]
    assert container.run(f"kill -0 {stray_pid}", check=False).returncode != 0, "the stray process survived the restart"
    assert container.run("systemctl is-active hsextract-server.service").stdout.strip() == "active"
    assert _health(container) == 200
    holder = int(container.run(f"fuser -n tcp {PORT} 2>/dev/null").stdout.split()[0])
    assert holder == _main_pid(container)


def test_extraction_in_the_container_verifies(deployed, container, inventory):
    result = run_playbook("playbooks/extract.yml", inventory, "-e", "hsx_extract_wait=true")
    assert result.rc == 0, result.output[-8000:]
    output = TEST_SETTINGS["hsx_output_dir"]
    verify = container.run(f"/opt/ml-env/bin/hsextract verify {output}", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    config = json.loads(container.run(f"cat {output}/data_config.json").stdout)
    assert config["total_samples"] + _bad_rows(container, output) == TEST_SETTINGS["hsx_extractor_sample_rows"]
    assert config["total_samples"] > 0


def _bad_rows(container: Container, output: str) -> int:
    text = container.run(f"cat {output}/errors.jsonl 2>/dev/null || true").stdout
    return len([line for line in text.splitlines() if re.search(r"\S", line)])
