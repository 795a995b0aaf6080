"""deploy.yml with ``hsx_runtime: venv``: the real SGLang 0.5.23 server in a real LXC container, then ``make extract``.

The container (hsx-sglang-test, 10.197.93.2, memory limited to 6 GiB) is given its ml-env as a Proxmox host gives
shared storage: this machine's ``.venv-sglang`` (``make setup-sglang``: sglang 0.5.23, torch 2.14.1, hsextract
editable from this checkout) bind-mounted read-only at the same path, with what a virtualenv needs beside it at
the paths it was built with (its base Python, the editable hsextract source), the stand-in ``sgl_kernel`` of
tests/sglang_live and a tiny float32 llama model (hidden 64), all read-only. The inventory says
``hsx_ml_env_provided: true``: deploy.yml installs nothing into the ml-env and only checks it. The server runs
on the CPU as in tests/sglang_live (docs/sglang.md): ``SGLANG_USE_CPU_ENGINE=1`` and the stand-in on
``PYTHONPATH`` through ``hsx_server_extra_environment``, the CPU flags through ``hsx_server_extra_args``.

The tests run in file order and share the deployment: the unit runs SGLang from the read-only ml-env with the
project's hook, ``/health_generate`` answers 200; ``make extract`` (playbooks/extract.yml, waiting) writes 20
rows that ``hsextract verify`` accepts, and the stand-in sgl_kernel was imported, never called; a second
deploy.yml run of the SGLang server's tags changes nothing and leaves the server process alone.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import (
    PORT,
    REPO,
    TEST_SETTINGS,
    TESTBED,
    Container,
    PlaybookResult,
    _require_host,
    http_status,
    run_make,
    run_playbook,
    server_main_pid,
)

NAME, NET, VMID = "hsx-sglang-test", "10.197.93", 193
#: the venv at the path its scripts name (a work tree may link the venv of another checkout)
ML_ENV = (REPO / ".venv-sglang").resolve()
STUB = REPO / "tests" / "sglang_live" / "stub"
#: where the container sees the model and the stand-in sgl_kernel (read-only bind mounts)
MODEL_IN_CONTAINER = "/srv/models/tiny-llama"
STUB_IN_CONTAINER = "/srv/sgl-kernel-stub"
STUB_LOG = "/var/log/hsextract-sgl_kernel-stub.log"
#: SGLang 0.5.23 on these CPUs (docs/sglang.md, tests/sglang_live/helpers.py CPU_ARGS)
CPU_ARGS = [
    "--device", "cpu", "--attention-backend", "torch_native", "--skip-tokenizer-init",
    "--max-total-tokens", "16384", "--dtype", "float32",
]  # fmt: skip
ROWS = 20
OUTPUT = str(TEST_SETTINGS["hsx_output_dir"])
UNIT = "hsextract-server.service"


def _base_python_prefix(venv: Path) -> Path | None:
    """The prefix of the venv's base interpreter when the container does not have it already (a pyenv one)."""
    lines = (venv / "pyvenv.cfg").read_text().splitlines()
    home = next(line.split("=", 1)[1].strip() for line in lines if line.split("=", 1)[0].strip() == "home")
    prefix = Path(home).parent
    return None if str(prefix) in ("/usr", "/usr/local") else prefix


def _editable_source(venv: Path) -> Path:
    """The hsextract source directory the venv's editable install points at (it must be seen at that path too)."""
    for direct_url in venv.glob("lib/python3*/site-packages/hsextract-*.dist-info/direct_url.json"):
        url = json.loads(direct_url.read_text()).get("url", "")
        if url.startswith("file://"):
            return Path(url.removeprefix("file://"))
    return REPO / "extractor"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ML_ENV / ".setup-done").exists():
        pytest.fail(f"{ML_ENV} is missing: make setup-sglang builds it (make test-deploy does)")
    path = tmp_path_factory.mktemp("sglang-deploy") / "tiny-llama"
    subprocess.run(
        [str(ML_ENV / "bin" / "hsextract"), "make-tiny-model", "--arch", "llama", "--hidden", "64", "--dtype", "float32",
         str(path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def container(request: pytest.FixtureRequest, model: Path) -> Container:
    _require_host()
    binds = [str(ML_ENV), str(_editable_source(ML_ENV)), f"{STUB}:{STUB_IN_CONTAINER}", f"{model}:{MODEL_IN_CONTAINER}"]
    base = _base_python_prefix(ML_ENV)
    if base is not None:
        binds.append(str(base))
    env = {**os.environ, "HSX_LXC_NAME": NAME, "HSX_LXC_NET": NET, "HSX_LXC_DIR": f"/var/tmp/{NAME}"}
    env.update(HSX_LXC_VMID=str(VMID), HSX_LXC_BIND_RO=" ".join(binds), HSX_LXC_MEMORY="6G")
    env.setdefault("HSX_HOST_PIP", str(REPO / ".venv" / "bin" / "pip"))
    request.addfinalizer(lambda: subprocess.run([str(TESTBED), "down"], env=env, check=False))
    proc = subprocess.run([str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=900)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"testbed.sh up {NAME} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    info = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return Container(
        info["HSX_LXC_NAME"], info["HSX_LXC_IP"], info["HSX_LXC_KEY"], info["HSX_LXC_WHEELHOUSE"],
        int(info["HSX_LXC_VMID"]), info["HSX_LXC_PCT"], Path(info["HSX_LXC_PCT_LOG"]),
    )  # fmt: skip


@pytest.fixture(scope="module")
def inventory(container: Container, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sglang-inventory") / "inventory"
    root.mkdir()
    example = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    settings = {
        **example,
        **TEST_SETTINGS,
        "hsx_runtime": "venv",
        # the ml-env the container is given: the venv's own path (a venv hard-codes it in its scripts)
        "hsx_ml_env": str(ML_ENV),
        "hsx_ml_env_provided": True,
        "hsx_model_path": MODEL_IN_CONTAINER,
        "hsx_server_make_tiny_model": False,
        "hsx_proxmox_manage": False,  # the Proxmox side is test_lxc_deploy.py's
        "hsx_disable_custom_all_reduce": False,  # no GPUs
        # /dev/shm budget of the tiny model: 4 x 1024 x 4 x 64 x 4 x 2 = 8 MiB, the 256 MiB floor wins
        "hsx_hidden_size": 64,
        "hsx_hidden_dtype": "float32",
        "hsx_server_extra_environment": {
            "SGLANG_USE_CPU_ENGINE": "1",
            "PYTHONPATH": STUB_IN_CONTAINER,
            "HSX_SGL_KERNEL_STUB_LOG": STUB_LOG,
        },
        "hsx_server_extra_args": CPU_ARGS,
        # SGLang loads in 60-110 s on these 2 cores (docs/sglang.md); more while other jobs share them
        "hsx_server_health_timeout_s": 600,
        "hsx_server_health_delay_s": 3,
        "hsx_extractor_sample_rows": ROWS,
    }
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    host = {
        "ansible_host": container.ip,
        "ansible_ssh_private_key_file": container.key,
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "hsx_proxmox_host": "none",
        "hsx_vmid": container.vmid,
    }
    groups = {"proxmox_hosts": {"hosts": {}}, "extraction_containers": {"hosts": {"lxc-sglang": host}}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def deployed(container: Container, inventory: Path) -> PlaybookResult:
    started = time.monotonic()
    result = run_playbook("deploy.yml", inventory)
    if result.rc != 0:
        journal = container.run(f"journalctl -u {UNIT} -n 60 --no-pager -o cat", check=False).stdout
        pytest.fail("deploy.yml failed:\n" + result.output[-8000:] + "\n--- server journal:\n" + journal)
    recap = result.recap()
    assert recap["lxc-sglang"]["failed"] == 0 and recap["lxc-sglang"]["changed"] > 0, recap
    print(f"deploy.yml with the real SGLang server: {time.monotonic() - started:.0f} s")
    return result


def _get_json(container: Container, path: str) -> Any:
    code = "import json, sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=60).read().decode())"
    proc = container.run(f"python3 -c {shlex.quote(code)} http://127.0.0.1:{PORT}{path}")
    return json.loads(proc.stdout)


def _stub_log(container: Container) -> list[str]:
    return container.run(f"cat {STUB_LOG} 2>/dev/null || true").stdout.split("\n")


def test_the_unit_runs_sglang_from_the_read_only_ml_env(deployed: PlaybookResult, container: Container) -> None:
    ml_env = str(ML_ENV)
    assert container.run(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    exec_start = container.run(f"systemctl show -p ExecStart --value {UNIT}").stdout
    assert f"path={ml_env}/bin/hsextract" in exec_start, exec_start
    assert "launch-sglang --config /etc/hsextract/sglang.yaml" in exec_start, exec_start
    # nothing was installed into it: the container sees it read-only (as shared storage)
    touch = container.run(f"touch {ml_env}/hsx-write-test", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr, touch
    # launch-sglang exec'd SGLang with the ml-env's interpreter, the project's hook and the CPU flags
    pid = server_main_pid(container)
    cmdline = container.run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.split("\n")
    assert cmdline[0] == f"{ml_env}/bin/python", cmdline
    assert "sglang.launch_server" in cmdline and "--forward-hooks" in cmdline, cmdline
    flags = [arg for arg in CPU_ARGS if arg.startswith("--")]
    assert all(flag in cmdline for flag in flags), cmdline
    for flag, value in itertools.pairwise(CPU_ARGS):
        if flag.startswith("--") and not value.startswith("--"):
            assert cmdline[cmdline.index(flag) + 1] == value, (flag, cmdline)
    environ = container.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    for variable in ("SGLANG_USE_CPU_ENGINE=1", f"PYTHONPATH={STUB_IN_CONTAINER}", "NCCL_NVLS_ENABLE=0"):
        assert variable in environ, f"{variable} not in the server's environment"
    assert http_status(container) == 200
    info = _get_json(container, "/server_info")
    assert (info["device"], info["attention_backend"], info["disable_radix_cache"]) == ("cpu", "torch_native", True), info
    assert info["model_path"] == MODEL_IN_CONTAINER and info["forward_hooks"], info


def test_make_extract_through_ansible_verifies(deployed: PlaybookResult, container: Container, inventory: Path) -> None:
    started = time.monotonic()
    # `make extract` with a configured inventory is `make ansible-extract`; .venv (the embedded default's) is not
    # used on that path: -o keeps make from building it where a checkout has none
    result = run_make("extract", inventory, "-o", ".venv/.setup-done", "HSX_EXTRACT_WAIT=true")
    assert result.rc == 0, result.output[-8000:]
    print(f"make extract ({ROWS} rows, real SGLang on the CPU in the container): {time.monotonic() - started:.0f} s")
    verify = container.run(f"{ML_ENV}/bin/hsextract verify {OUTPUT}", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    config = json.loads(container.run(f"cat {OUTPUT}/data_config.json").stdout)
    assert config["total_samples"] == ROWS, config
    assert container.run(f"cat {OUTPUT}/errors.jsonl 2>/dev/null || true").stdout.strip() == ""
    # the dumps came from the hook in SGLang's scheduler: SGLang computed with torch, never with sgl_kernel
    log = _stub_log(container)
    assert any(line.endswith(" import") for line in log), f"the stand-in sgl_kernel was not imported: {log}"
    assert not [line for line in log if " call " in line], f"SGLang called sgl_kernel: {log}"


#: the tags of what only this test deploys: the SGLang server's config, unit and start (the venv runtime with a
#: provided ml-env installs nothing: hsx_sglang_runtime_install is a no-op here)
SECOND_RUN_TAGS = "hsx_sglang_runtime_install,hsx_server_configure,hsx_server_run"


def test_second_deploy_changes_nothing(deployed: PlaybookResult, container: Container, inventory: Path) -> None:
    """The second deploy.yml run of the venv runtime's parts changes nothing and leaves the server process alone.

    Only the SGLang-specific tags run: the rest of deploy.yml (preflight play, hsx_container_env, hsx_extractor) is
    the embedded test's, whose second full run (test_lxc_incidents.py) checks it reports changed=0; the probes skipped
    here (the ml-env's imports of torch and sglang in the preflights, most of a full pass's two minutes on these two
    cores) change nothing by construction (changed_when: false)."""
    pid = server_main_pid(container)
    started = time.monotonic()
    result = run_playbook("deploy.yml", inventory, "--tags", SECOND_RUN_TAGS)
    assert result.rc == 0, result.output[-8000:]
    print(f"second deploy.yml (--tags {SECOND_RUN_TAGS}): {time.monotonic() - started:.0f} s")
    recap = result.recap()["lxc-sglang"]
    assert recap["changed"] == 0, recap
    # it did go through the server's tasks (a tag typo would run nothing and pass)
    for task in ("hsx_server : Render the server config", "hsx_server : Enable and start hsextract-server"):
        assert f"TASK [{task}]" in result.output, f"{task} did not run: {result.output[-4000:]}"
    assert server_main_pid(container) == pid, "the second deploy.yml run restarted the server"
