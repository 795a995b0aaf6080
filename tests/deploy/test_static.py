"""Checks that need no container: lint, syntax, role interfaces, the Proxmox-host role on a scratch
directory (with a recording stand-in for pct), the /dev/shm sizing, the placeholder stop."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from .helpers import ANSIBLE_BIN, REPO, SHM_HUGE, PlaybookResult, ansible_env, run_playbook

ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_match_defaults(role: Path):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert set(specs["main"]["options"]) == set(defaults), f"{role.name}: argument_specs and defaults differ"
    assert all(name.startswith(role.name + "_") for name in defaults), f"{role.name}: public vars must be {role.name}_*"
    lines = (role / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            assert lines[i - 1].startswith("# "), f"{role.name}: {line.split(':')[0]} has no one-line comment above it"


def _readme_cell(value: object) -> str:
    """How a role README's variables table writes a default: a non-empty string as it is, anything else as JSON."""
    return value if isinstance(value, str) and value else json.dumps(value)


def _deploy_role_vars() -> dict[str, str]:
    """The role variables deploy.yml sets, each to the expression inside its {{ }}."""
    found: dict[str, str] = {}
    for play in yaml.safe_load((REPO / "deploy.yml").read_text()):
        for entry in play.get("roles") or []:
            for name, value in (entry.get("vars") or {}).items():
                found[name] = str(value).strip().removeprefix("{{").removesuffix("}}").strip()
    return found


def _table(text: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first markdown table under `heading`, keyed by the header's cells, backticks stripped."""
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    split = [[cell.strip().strip("`") for cell in line.strip("|").split(" | ")] for line in lines]
    header, rows = split[0], split[2:]
    assert all(len(row) == len(header) for row in rows), f"{heading}: a row has not {len(header)} cells"
    return [dict(zip(header, row, strict=True)) for row in rows]


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_readme_lists_every_variable_default_and_tag(role: Path) -> None:
    readme = role / "README.md"
    assert readme.is_file(), f"{role.name} has no README.md"
    text = readme.read_text()
    assert text.startswith(f"# {role.name}\n"), f"{readme}: first line must be '# {role.name}'"
    for heading in ("## Variables", "## Tags", "## Example"):
        assert f"\n{heading}\n" in text, f"{readme} lacks a '{heading}' section"

    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    rows = _table(text, "## Variables")
    listed = [row["variable"] for row in rows]
    assert sorted(listed) == sorted(defaults), (
        f"{readme}: variables table differs from defaults/main.yml: missing {sorted(set(defaults) - set(listed))},"
        f" extra {sorted(set(listed) - set(defaults))}"
    )
    for row in rows:
        assert row["default"] == _readme_cell(defaults[row["variable"]]), f"{readme}: default of {row['variable']}"

    # the variables deploy.yml sets (above the inventory in precedence), and to what
    from_deploy = {name: expr for name, expr in _deploy_role_vars().items() if name in defaults}
    column = "deploy.yml sets it to"
    if from_deploy:
        assert {row["variable"]: row[column] for row in rows if row[column]} == from_deploy, f"{readme}: {column}"
    else:
        assert column not in rows[0], f"{readme}: deploy.yml sets none of {role.name}'s variables"

    tags = [task["tags"] for task in yaml.safe_load((role / "tasks" / "main.yml").read_text()) if "tags" in task]
    assert tags, f"{role.name}: tasks/main.yml tags nothing"
    assert sorted(row["tag"] for row in _table(text, "## Tags")) == sorted(t for ts in tags for t in ts), readme
    entry_points = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry_point in set(entry_points) - {"main"}:
        assert f"`{entry_point}`" in text and f"{entry_point}.yml" in text, f"{readme}: entry point {entry_point}"


def test_deploy_doc_links_every_role_readme() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()
    for role in ROLES:
        assert f"(../roles/{role.name}/README.md)" in text, role.name


def _make(*args: str) -> str:
    env = {k: v for k, v in ansible_env().items() if not k.startswith("MAKE")}  # not the make that runs the tests
    done = subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env, capture_output=True, text=True)
    return done.stdout


def test_make_help_lists_every_target_with_its_text_aligned() -> None:
    phony = next(line for line in _make("-pRrq").splitlines() if line.startswith(".PHONY:")).split()[1:]
    assert {"help", "lint", "test", "deploy", "status", "test-monitoring", "monitoring-rules"} <= set(phony)
    lines = _make("-s", "help").splitlines()
    rows = [re.fullmatch(r"  make (\S+) +(\S.*)", line) for line in lines]
    assert all(rows), f"make help line not '  make TARGET  text': {lines[rows.index(None)]!r}"
    listed = [row.group(1) for row in rows if row]
    assert sorted(set(phony) - set(listed)) == [], "phony targets without a '## text' comment, so not in make help"
    # every text starts in one column, two spaces past the longest target name
    assert {row.start(2) for row in rows if row} == {len("  make ") + max(map(len, listed)) + 2}


def test_syntax_check():
    for playbook in ("deploy.yml", "playbooks/restart.yml", "playbooks/extract.yml", "playbooks/status.yml",
                     "playbooks/regenerate.yml"):
        proc = subprocess.run(
            [str(ANSIBLE_BIN / "ansible-playbook"), "--syntax-check", playbook],
            cwd=REPO, env=ansible_env(), capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile():
    proc = subprocess.run(
        [str(ANSIBLE_BIN / "ansible-lint"), "--offline"], cwd=REPO, env=ansible_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]


def test_placeholders_stop_deploy_with_the_variable_named():
    result = run_playbook("deploy.yml", None, "--limit", "extraction_containers")
    assert result.rc != 0
    assert "set ansible_host in your inventory" in result.output or "set hsx_model_path in your inventory" in result.output


#: config.json of the models the tests size /dev/shm for: Kimi-K2.5 keeps its text model's sizes in text_config
KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "text_config": {"hidden_size": 7168, "num_hidden_layers": 61},
}
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32}


def _shm_size(tmp_path: Path, settings: dict, model_config: dict | None, via_proxmox_mount: bool = False) -> PlaybookResult:
    """hsx_shm_size_mb_effective for inventory/example with `settings`, as deploy.yml computes it: the model's
    config.json read by playbooks/tasks/model-config.yml (in the container, or on the Proxmox host through the bind
    mount the model lies under), then playbooks/vars/deploy.yml. This machine plays both hosts."""
    store = tmp_path / "store"
    (store / "model").mkdir(parents=True)
    if model_config is not None:
        (store / "model" / "config.json").write_text(json.dumps(model_config))
    example = yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())
    where: dict[str, object] = {"hsx_model_path": str(store / "model")}
    if via_proxmox_mount:  # the container would see the store at /srv/models
        where = {"hsx_model_path": "/srv/models/model", "hsx_proxmox_lxc_mounts": [{"host": f"{store}/", "path": "/srv/models"}]}
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({**example, **where, "hsx_proxmox_host": "localhost", **settings}))
    playbook = tmp_path / "shm.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: localhost
          gather_facts: false
          vars_files: [{tmp_path}/vars.yml, {REPO}/playbooks/vars/deploy.yml]
          tasks:
            - ansible.builtin.import_tasks: {REPO}/playbooks/tasks/model-config.yml
              vars:
                _hsx_model_config_from: {"proxmox" if via_proxmox_mount else "container"}
            - ansible.builtin.debug:
                msg: "SHM={{{{ hsx_shm_size_mb_effective }}}}"
        """)
    )
    return run_playbook(str(playbook), None, "-e", "ansible_python_interpreter=" + str(ANSIBLE_BIN / "python"))


@pytest.mark.parametrize(
    ("settings", "expected_mb"),
    [
        # Kimi-K2.5: 256 in flight (hsextract's default) x 4096 tokens x (3 + 1) x 7168 x 2 bytes (bf16) x 2.0 = 112 GiB
        ({}, 114688),
        # speculators also dumps the pre-norm final state: (3 + 1 + 1) layers
        ({"hsx_output_format": "speculators"}, 143360),
        # K from hsx_layer_ids when set: 8 x 4096 x (5 + 1) x 7168 x 4 bytes (float32) x 2.0
        ({"hsx_layer_ids": [1, 2, 3, 4, 5], "hsx_hidden_dtype": "float32", "hsx_concurrency": 8}, 10752),
        # hsx_hidden_size set: it wins over config.json
        ({"hsx_concurrency": 4, "hsx_max_seq_len": 1024, "hsx_hidden_size": 128}, 1024),
        ({"hsx_shm_size_mb": 20000}, 20000),
    ],
)
def test_shm_size_from_the_dump_budget(tmp_path: Path, settings: dict, expected_mb: int):
    result = _shm_size(tmp_path, settings, KIMI_K25_CONFIG)
    assert result.rc == 0, result.output
    assert f"SHM={expected_mb}" in result.output


@pytest.mark.parametrize("via_proxmox_mount", [False, True], ids=["in-the-container", "on-the-proxmox-host"])
def test_shm_size_takes_the_hidden_size_from_the_models_config(tmp_path: Path, via_proxmox_mount: bool) -> None:
    """Defect 12 of issue 23: the inventory's hsx_hidden_size was Kimi's 7168 for every model, and /dev/shm followed it.
    A Llama-8B-sized model (hidden 4096): 256 x 4096 x (3 + 1) x 4096 x 2 bytes x 2.0 = 64 GiB."""
    result = _shm_size(tmp_path, {}, LLAMA_CONFIG, via_proxmox_mount)
    assert result.rc == 0, result.output
    assert "SHM=65536" in result.output, result.output[-3000:]


def test_shm_size_without_a_hidden_size_stops_saying_what_to_set(tmp_path: Path) -> None:
    result = _shm_size(tmp_path, {}, None)
    assert result.rc != 0
    for words in ("hsx_hidden_size is 0", f"{tmp_path}/store/model/config.json", "set hsx_hidden_size in the inventory"):
        assert words in result.flat, words


PVE_CONF = """\
arch: amd64
cores: 64
features: keyctl=1
hostname: hsx1
memory: 1048576
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth
ostype: debian
rootfs: local-zfs:subvol-101-disk-0,size=500G
swap: 0
lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=128M,create=dir 0 0
lxc.mount.entry: /data/models data/models none bind,create=dir 0 0

[before-upgrade]
arch: amd64
lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=128M,create=dir 0 0
snaptime: 1760000000
"""

PVE_EXPECTED = """\
arch: amd64
cores: 64
features: keyctl=1,nesting=1
hostname: hsx1
memory: 1048576
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth
ostype: debian
rootfs: local-zfs:subvol-101-disk-0,size=500G
swap: 0
lxc.mount.entry: /data/models data/models none bind,create=dir 0 0
lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=3584M{huge},create=dir 0 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir

[before-upgrade]
arch: amd64
lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=128M,create=dir 0 0
snaptime: 1760000000
"""


def test_proxmox_role_on_a_scratch_config_dir(tmp_path: Path):
    conf_dir = tmp_path / "pve-lxc"
    conf_dir.mkdir()
    (conf_dir / "101.conf").write_text(PVE_CONF)
    pct_log = tmp_path / "pct.log"
    pct = tmp_path / "pct"
    pct.write_text(f'#!/bin/sh\necho "$*" >> {pct_log}\n[ "$1" = status ] && echo "status: running"\nexit 0\n')
    pct.chmod(0o755)
    python = str(ANSIBLE_BIN / "python")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "proxmox_hosts": {
                            "hosts": {"pve-scratch": {"ansible_connection": "local", "ansible_python_interpreter": python}}
                        },
                        "extraction_containers": {
                            "hosts": {"hsx-scratch": {"ansible_connection": "local", "ansible_python_interpreter": python}}
                        },
                    }
                }
            }
        )
    )
    playbook = tmp_path / "pve.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: extraction_containers
          gather_facts: false
          roles:
            - role: {REPO}/roles/hsx_proxmox_lxc
              vars:
                hsx_proxmox_lxc_host: pve-scratch
                hsx_proxmox_lxc_vmid: 101
                hsx_proxmox_lxc_config_dir: {conf_dir}
                hsx_proxmox_lxc_shm_size_mb: 3584
                hsx_proxmox_lxc_gpu_count: 2
                hsx_proxmox_lxc_device_majors: [195, 508]
                hsx_proxmox_lxc_nesting: true
                hsx_proxmox_lxc_pct: {pct}
        """)
    )
    # check mode: nothing written, pct only asked for the status
    result = run_playbook(str(playbook), inventory, "--check", "--diff")
    assert result.rc == 0, result.output
    assert (conf_dir / "101.conf").read_text() == PVE_CONF
    assert pct_log.read_text().splitlines() == ["status 101"]
    assert result.recap()["hsx-scratch"]["changed"] == 1
    # real run: the file line by line, and one reboot
    pct_log.unlink()
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    got, want = (conf_dir / "101.conf").read_text().splitlines(), PVE_EXPECTED.format(huge=SHM_HUGE).splitlines()
    assert len(got) == len(want), f"{len(got)} lines rendered, {len(want)} expected"
    for number, (line, expected) in enumerate(zip(got, want, strict=True), start=1):
        assert line == expected, f"line {number}: {line!r} != {expected!r}"
    assert len(got) == len(want)
    assert pct_log.read_text().splitlines() == ["status 101", "reboot 101"]
    # second run: nothing changes, no reboot
    pct_log.unlink()
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    assert result.recap()["hsx-scratch"]["changed"] == 0
    assert not pct_log.exists()


def test_a_container_whose_memory_cannot_hold_shm_stops_the_deploy_saying_what_to_lower(tmp_path: Path):
    """Both roles that size /dev/shm refuse a size the container's memory cannot hold (tmpfs lives in memory): the
    Proxmox side from the config's memory: before it writes anything, the container side from inside."""
    python = str(ANSIBLE_BIN / "python")
    conf_dir = tmp_path / "pve-lxc"
    conf_dir.mkdir()
    small = PVE_CONF.replace("memory: 1048576", "memory: 4096")
    (conf_dir / "101.conf").write_text(small)
    pct_log = tmp_path / "pct.log"
    pct = tmp_path / "pct"
    pct.write_text(f'#!/bin/sh\necho "$*" >> {pct_log}\nexit 0\n')
    pct.chmod(0o755)
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": python}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"pve-scratch": local, "hsx-scratch": local}}}))

    def play(role: str, **role_vars: object) -> Path:
        playbook = tmp_path / f"{role}.yml"
        entry = {"role": str(REPO / "roles" / role), "vars": role_vars}
        playbook.write_text(yaml.safe_dump([{"hosts": "hsx-scratch", "gather_facts": False, "roles": [entry]}]))
        return playbook

    proxmox = {
        "hsx_proxmox_lxc_host": "pve-scratch", "hsx_proxmox_lxc_vmid": 101, "hsx_proxmox_lxc_config_dir": str(conf_dir),
        "hsx_proxmox_lxc_gpu_count": 0, "hsx_proxmox_lxc_pct": str(pct),
    }  # fmt: skip
    # 4096 MiB of memory: 3072 MiB of /dev/shm + 2048 MiB kept free do not fit, 2048 + 2048 do
    result = run_playbook(str(play("hsx_proxmox_lxc", **proxmox, hsx_proxmox_lxc_shm_size_mb=3072)), inventory)
    assert result.rc != 0
    for words in ("memory: 4096 MiB", "3072 MiB of /dev/shm", "Lower hsx_concurrency or hsx_max_seq_len", "pct set 101 --memory"):
        assert words in result.flat, words
    assert (conf_dir / "101.conf").read_text() == small and not pct_log.exists()
    result = run_playbook(str(play("hsx_proxmox_lxc", **proxmox, hsx_proxmox_lxc_shm_size_mb=2048)), inventory, "--check")
    assert result.rc == 0, result.output

    # inside the container (here: this machine), its preflight only
    meminfo = Path("/proc/meminfo").read_text()
    memory_mb = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1)) // 1024  # type: ignore[union-attr]
    env = play("hsx_container_env", hsx_container_env_ml_env=str(tmp_path / "ml-env"))
    args = ("--tags", "hsx_container_env_preflight", "-e")
    result = run_playbook(str(env), inventory, *args, f"hsx_container_env_shm_size_mb={memory_mb}")
    assert result.rc != 0
    for words in (f"{memory_mb} MiB of /dev/shm", "Lower hsx_concurrency or hsx_max_seq_len", "more memory"):
        assert words in result.flat, words
    result = run_playbook(str(env), inventory, *args, "hsx_container_env_shm_size_mb=64")
    assert result.rc == 0, result.output


def test_disable_custom_all_reduce_from_the_inventory_to_the_sglang_command(tmp_path: Path):
    """inventory/example's hsx_disable_custom_all_reduce, mapped by deploy.yml into hsx_server, rendered by the role's
    vars into sglang.yaml; launch-sglang (the package, from .venv) turns it into --disable-custom-all-reduce."""
    hsextract = REPO / ".venv" / "bin" / "hsextract"
    if not hsextract.exists():
        pytest.skip("needs .venv (make setup) for launch-sglang --dry-run; make test builds it first")
    example = yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())
    assert example["hsx_disable_custom_all_reduce"] is True, "inventory/example: on for LXC deployments"
    deploy = yaml.safe_load((REPO / "deploy.yml").read_text())
    mapping = next(r["vars"] for play in deploy for r in play.get("roles", []) if r["role"] == "hsx_server")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61}'
    )
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({**example, "hsx_model_path": str(model)}))
    (tmp_path / "mapping.yml").write_text(yaml.safe_dump(mapping))
    role = REPO / "roles" / "hsx_server"
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: localhost
          gather_facts: false
          vars_files: [{role}/defaults/main.yml, {tmp_path}/inventory.yml, {REPO}/playbooks/vars/deploy.yml,
                       {tmp_path}/mapping.yml, {role}/vars/main.yml]
          tasks:
            - ansible.builtin.copy:
                content: "{{{{ _hsx_server_config | to_nice_yaml }}}}"
                dest: {tmp_path}/on.yaml
                mode: "0644"
            - ansible.builtin.copy:
                content: "{{{{ _hsx_server_config | to_nice_yaml }}}}"
                dest: {tmp_path}/off.yaml
                mode: "0644"
              vars:
                hsx_disable_custom_all_reduce: false
            - ansible.builtin.copy:
                content: "{{{{ _hsx_server_config | to_nice_yaml }}}}"
                dest: {tmp_path}/fp8.yaml
                mode: "0644"
              vars:
                hsx_hidden_dtype: float8_e4m3fn
                hsx_output_format: speculators
        """)
    )
    result = run_playbook(str(playbook), None, "-e", "ansible_python_interpreter=" + str(ANSIBLE_BIN / "python"))
    assert result.rc == 0, result.output
    # FP8 dumps (hsx_hidden_dtype float8_e4m3fn) reach the SGLang hook's config; the others have no storage key
    fp8 = yaml.safe_load((tmp_path / "fp8.yaml").read_text())
    assert fp8["storage"] == "float8_e4m3fn" and "storage" not in yaml.safe_load((tmp_path / "on.yaml").read_text())
    assert fp8["final_prenorm"] is True, "speculators stores the pre-norm final state: the hook must dump it"
    proc = subprocess.run(
        [str(hsextract), "launch-sglang", "--config", str(tmp_path / "fp8.yaml"), "--dry-run"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and '"storage":"float8_e4m3fn"' in proc.stdout, proc.stdout + proc.stderr
    for name, wanted in (("on", True), ("off", False)):
        rendered = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        assert rendered["disable_custom_all_reduce"] is wanted, rendered
        proc = subprocess.run(
            [str(hsextract), "launch-sglang", "--config", str(tmp_path / f"{name}.yaml"), "--dry-run"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert ("--disable-custom-all-reduce" in proc.stdout.split()) is wanted, proc.stdout


def test_every_test_a_runbook_names_exists():
    """Runbooks point at the tests that replay their procedures (tests/<dir>/<file>.py::<test> or ::<test> after it)."""
    import ast
    import re

    named: list[tuple[str, str, str]] = []
    for page in sorted((REPO / "docs" / "runbooks").glob("*.md")):
        current = ""
        for path, rest in re.findall(r"(tests/(?:\w+/)*test_\w+\.py)?((?:::\w+)+)?", page.read_text()):
            current = path or current
            named += [(page.name, current, test) for test in re.findall(r"::(\w+)", rest)]
    assert {test for _, _, test in named} >= {
        "test_server_started_with_another_python_is_refused",
        "test_restart_escalates_through_pct_when_ssh_is_down",
        "test_server_answering_health_but_not_health_generate_is_never_healthy",
        "test_after_pct_reboot_shm_nccl_and_the_server_come_back",
    }, named
    for page_name, path, test in named:
        tree = ast.parse((REPO / path).read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert test in functions, f"{page_name} names {path}::{test}, which does not exist"


def _configured_copy_of_the_example(tmp_path: Path) -> Path:
    """inventory/example with every CHANGE_ME value filled in, its comments (which mention CHANGE_ME) kept."""
    inventory = tmp_path / "mysite"
    shutil.copytree(REPO / "inventory" / "example", inventory)
    for path in inventory.rglob("*.yml"):
        text = re.sub(r"^(\s*[\w.]+:\s*)CHANGE_ME\b", r"\g<1>192.0.2.10", path.read_text(), flags=re.M)
        path.write_text(text.replace("hsx_vmid: 192.0.2.10", "hsx_vmid: 101"))
    values = {}
    for path in inventory.rglob("*.yml"):
        assert "CHANGE_ME" in path.read_text(), f"{path}: the test wants the explanatory comments kept"
        values[path.name] = yaml.safe_load(path.read_text())
    assert "CHANGE_ME" not in json.dumps(values), "a value is still CHANGE_ME"
    return inventory


@pytest.mark.parametrize("configured", [True, False], ids=["configured-copy", "example"])
def test_make_picks_a_configured_inventory_whose_comments_mention_change_me(tmp_path: Path, configured: bool) -> None:
    """Defect 1 of issue 23: `make extract INVENTORY=inventory/mysite` ran the local demo because the check grepped
    the comments too. The same variable picks the inventory of make status and make merge."""
    inventory = _configured_copy_of_the_example(tmp_path) if configured else REPO / "inventory" / "example"
    database = _make("-pRrq", "-o", ".venv/.setup-done", f"INVENTORY={inventory}")
    value = re.search(r"^HSX_INVENTORY_CONFIGURED := ?(.*)$", database, re.M)
    assert value is not None, "mk/ansible.mk no longer sets HSX_INVENTORY_CONFIGURED"
    assert value.group(1) == ("yes" if configured else ""), value.group(0)
    # what `make extract` would run: the containers' extraction, or the embedded default
    dry_run = _make("-n", "-o", ".venv/.setup-done", "extract", f"INVENTORY={inventory}")
    assert ("playbooks/extract.yml" in dry_run) is configured, dry_run
    assert ("scripts/run-default.sh" in dry_run) is not configured, dry_run


def _pct_host(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A scratch Proxmox host for `pct create`: its /etc/pve/lxc, a template, and a pct that is the stand-in
    scripts/lxc/pct for everything but `start` (recorded only: starting needs LXC, test_lxc_create.py does it)."""
    conf_dir, template_dir, state = tmp_path / "pve-lxc", tmp_path / "templates", tmp_path / "cts"
    rootfs = tmp_path / "template-rootfs"
    for path in (conf_dir, template_dir, state, rootfs / "etc" / "systemd" / "system", rootfs / "root"):
        path.mkdir(parents=True)
    (rootfs / "etc" / "os-release").write_text("ID=debian\n")
    subprocess.run(["tar", "-C", str(rootfs), "-czf", str(template_dir / "debian-12.tar.gz"), "."], check=True)
    pct_log = tmp_path / "pct.log"
    pct = tmp_path / "pct"
    pct.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = start ] && {{ echo "$*" >> {pct_log}; exit 0; }}\n'
        f"HSX_PCT_CONF_DIR={conf_dir} HSX_PCT_STATE={state} HSX_PCT_TEMPLATE_DIR={template_dir} HSX_PCT_LOG={pct_log} "
        f'exec {REPO}/scripts/lxc/pct "$@"\n'
    )
    pct.chmod(0o755)
    return conf_dir, pct, pct_log


def _proxmox_play(tmp_path: Path, pct: Path, conf_dir: Path, **role_vars: object) -> tuple[Path, Path]:
    python = str(ANSIBLE_BIN / "python")
    local = {"ansible_connection": "local", "ansible_python_interpreter": python}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"pve-scratch": local, "hsx-new": local}}}))
    settings = {
        "hsx_proxmox_lxc_host": "pve-scratch", "hsx_proxmox_lxc_vmid": 195, "hsx_proxmox_lxc_config_dir": str(conf_dir),
        "hsx_proxmox_lxc_pct": str(pct), "hsx_proxmox_lxc_shm_size_mb": 256, "hsx_proxmox_lxc_gpu_count": 1,
        "hsx_proxmox_lxc_device_majors": [195], "hsx_proxmox_lxc_template": "local:vztmpl/debian-12.tar.gz",
        "hsx_proxmox_lxc_cores": 2, "hsx_proxmox_lxc_memory_mb": 4096, "hsx_proxmox_lxc_rootfs_storage": "local-lvm",
        "hsx_proxmox_lxc_rootfs_size_gb": 8, "hsx_proxmox_lxc_net0": "name=eth0,bridge=vmbr0,ip=10.197.95.2/30,gw=10.197.95.1",
        "hsx_proxmox_lxc_features": ["keyctl=1"], "hsx_proxmox_lxc_nesting": True,
        "hsx_proxmox_lxc_mounts": [{"host": "/tank/models", "path": "/srv/models", "ro": True}],
        **role_vars,
    }  # fmt: skip
    playbook = tmp_path / "create.yml"
    entry = {"role": str(REPO / "roles" / "hsx_proxmox_lxc"), "vars": settings}
    playbook.write_text(yaml.safe_dump([{"hosts": "hsx-new", "gather_facts": False, "roles": [entry]}]))
    return playbook, inventory


#: what the role writes for VMID 195: the stand-in's pct create lines (Proxmox's: keys sorted, net0 with hwaddr and
#: type=veth), then the role's /dev/shm and GPU lines
CREATED_CONF = """\
arch: amd64
cores: 2
features: keyctl=1,nesting=1
hostname: hsx-new
memory: 4096
mp0: /tank/models,mp=/srv/models,ro=1
net0: name=eth0,bridge=vmbr0,gw=10.197.95.1,hwaddr=BC:24:11:00:00:C3,ip=10.197.95.2/30,type=veth
ostype: debian
rootfs: local-lvm:vm-195-disk-0,size=8G
swap: 0
lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size=256M{huge},create=dir 0 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir
"""


def test_proxmox_role_creates_a_missing_container_once(tmp_path: Path) -> None:
    conf_dir, pct, pct_log = _pct_host(tmp_path)
    playbook, inventory = _proxmox_play(tmp_path, pct, conf_dir)
    # check mode: says what it would create, creates nothing
    result = run_playbook(str(playbook), inventory, "--check")
    assert result.rc == 0, result.output
    assert "container 195 would be created on pve-scratch" in result.flat
    assert f"{pct} create 195 local:vztmpl/debian-12.tar.gz --hostname hsx-new --cores 2 --memory 4096" in result.flat
    assert not (conf_dir / "195.conf").exists() and not pct_log.exists()
    # real run: pct create, the role's lines into the new config, no reboot (it was stopped), pct start
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    assert (conf_dir / "195.conf").read_text() == CREATED_CONF.format(huge=SHM_HUGE)
    calls = [line.split()[0] for line in pct_log.read_text().splitlines()]
    assert calls == ["create", "status", "start"], calls
    assert "--mp0 /tank/models\\,mp=/srv/models\\,ro=1" in pct_log.read_text()
    # the second run: nothing changes, no pct call
    pct_log.unlink()
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    assert result.recap()["hsx-new"]["changed"] == 0, result.recap()
    assert not pct_log.exists(), pct_log.read_text()


@pytest.mark.parametrize(
    ("role_vars", "words"),
    [
        ({"hsx_proxmox_lxc_create": False}, ["does not exist on pve-scratch", "hsx_proxmox_lxc_create is false"]),
        ({"hsx_proxmox_lxc_template": ""}, ["set hsx_proxmox_lxc_template to a template volume", "pveam"]),
        ({"hsx_proxmox_lxc_memory_mb": 2048}, ["hsx_proxmox_lxc_memory_mb (2048 MiB) cannot hold the 256 MiB of /dev/shm"]),
    ],
    ids=["create-off", "no-template", "memory"],
)
def test_proxmox_role_refuses_to_create_saying_what_to_set(tmp_path: Path, role_vars: dict, words: list[str]) -> None:
    conf_dir, pct, pct_log = _pct_host(tmp_path)
    playbook, inventory = _proxmox_play(tmp_path, pct, conf_dir, **role_vars)
    result = run_playbook(str(playbook), inventory)
    assert result.rc != 0
    for text in words:
        assert text in result.flat, text
    assert not pct_log.exists() and not (conf_dir / "195.conf").exists()


def test_proxmox_role_refuses_an_existing_container_in_the_other_mode_or_without_a_mount(tmp_path: Path) -> None:
    """An existing container is not rebuilt: another privilege mode, or a missing bind mount, stops with the fix.
    Its other creation settings (here cores and memory) are left as they are."""
    conf_dir, pct, pct_log = _pct_host(tmp_path)
    subprocess.run(
        [str(pct), "create", "195", "local:vztmpl/debian-12.tar.gz", "--hostname", "other", "--cores", "1",
         "--memory", "8192", "--unprivileged", "1", "--net0", "name=eth0,bridge=vmbr0,ip=dhcp"],
        check=True,
    )  # fmt: skip
    before = (conf_dir / "195.conf").read_text()
    pct_log.unlink()
    playbook, inventory = _proxmox_play(tmp_path, pct, conf_dir)
    result = run_playbook(str(playbook), inventory)
    assert result.rc != 0
    for words in ("Container 195 (hsx-new) exists and is unprivileged", "hsx_proxmox_lxc_unprivileged is False",
                  "give hsx_vmid a free VMID"):  # fmt: skip
        assert words in result.flat, words
    assert (conf_dir / "195.conf").read_text() == before and not pct_log.exists()

    playbook, inventory = _proxmox_play(tmp_path, pct, conf_dir, hsx_proxmox_lxc_unprivileged=True)
    result = run_playbook(str(playbook), inventory)
    assert result.rc != 0
    for words in ("exists without the bind mount(s) /tank/models,mp=/srv/models,ro=1", "pct set 195 --mpN <value>"):
        assert words in result.flat, words
    assert (conf_dir / "195.conf").read_text() == before and not pct_log.exists()

    # with the mount there, the role only sets its own lines: cores 1 and memory 8192 stay
    conf_file = conf_dir / "195.conf"
    conf_file.write_text(conf_file.read_text().replace("memory:", "mp0: /tank/models,mp=/srv/models,ro=1\nmemory:"))
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    conf = (conf_dir / "195.conf").read_text().splitlines()
    assert {"cores: 1", "memory: 8192", "unprivileged: 1", "features: nesting=1"} <= set(conf), conf
    assert pct_log.read_text().splitlines() == ["status 195"], "a stopped existing container is neither rebooted nor started"


def test_make_regenerate_without_an_inventory_names_the_fix_and_runs_nothing() -> None:
    env = {k: v for k, v in ansible_env().items() if not k.startswith("MAKE")}
    argv = ["make", "--no-print-directory", "-o", ".venv/.setup-done", "-o", f"{ANSIBLE_BIN.parent}/.setup-done",
            f"ANSIBLE_VENV={ANSIBLE_BIN.parent}", "HSX_INVENTORY_CONFIGURED=", "regenerate"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ConfigError: make regenerate needs an inventory: INVENTORY=DIR" in done.stderr, done.stderr
    assert "ansible-playbook" not in done.stdout + done.stderr
