"""Inventory-driven shards, without a container: every host of extraction_containers gets a stable shard,
rendered into its extraction config by the hsx_extractor role, by the same rule as hsextract's own
(hsextract.ops.inventory.assign_shards, which make status and make merge use); duplicates stop the preflight."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import ANSIBLE_BIN, REPO, run_playbook

PACKAGE_PYTHON = REPO / ".venv" / "bin" / "python"
SETTINGS = {
    "ansible_connection": "local",
    "hsx_model_path": "/models/m",
    "hsx_dataset": "/data/d.jsonl",
    "hsx_output_dir": "/out",
    "hsx_runtime": "embedded",
    "hsx_ml_env": "/opt/ml-env",
    "hsx_proxmox_manage": False,
}


def write_inventory(directory: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    example = yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())
    group_vars = {**example, **SETTINGS, "ansible_python_interpreter": str(ANSIBLE_BIN / "python")}
    (directory / "group_vars").mkdir(parents=True)
    (directory / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    hosts = {name: {"ansible_host": "127.0.0.1", **values} for name, values in hosts.items()}
    (directory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"extraction_containers": {"hosts": hosts}}}}))
    return directory


def rendered_configs(tmp_path: Path, inventory: Path) -> dict[str, dict[str, Any]]:
    """Each host's extraction config as the hsx_extractor role renders it (the role's own vars)."""
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: extraction_containers
          gather_facts: false
          vars_files: [{REPO}/playbooks/vars/deploy.yml]
          vars:  # as deploy.yml passes them to the role
            hsx_extractor_dataset: "{{{{ hsx_dataset }}}}"
            hsx_extractor_output: "{{{{ hsx_output_dir }}}}"
            hsx_extractor_shard_index: "{{{{ hsx_shard_index_effective }}}}"
            hsx_extractor_num_shards: "{{{{ hsx_num_shards_effective }}}}"
          tasks:
            - ansible.builtin.include_role:
                name: hsx_extractor
                tasks_from: preflight.yml
                public: true
            - ansible.builtin.copy:
                content: "{{{{ _hsx_extractor_config | to_json }}}}"
                dest: "{tmp_path}/{{{{ inventory_hostname }}}}.json"
                mode: "0644"
        """)
    )
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    configs = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    return configs


def package_rule(hosts: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """hsextract's own assignment, run with the package's interpreter."""
    code = (
        "import json, sys; from hsextract.ops.inventory import assign_shards; h = json.loads(sys.argv[1]); "
        "s, n = assign_shards(list(h), h); print(json.dumps({k: [v, n] for k, v in s.items()}))"
    )
    done = subprocess.run([str(PACKAGE_PYTHON), "-c", code, json.dumps(hosts)], capture_output=True, text=True, check=True)
    return {k: (v[0], v[1]) for k, v in json.loads(done.stdout).items()}


@pytest.mark.parametrize(
    "hosts",
    [
        {"hsx-c": {}, "hsx-a": {}, "hsx-b": {}},
        # hsx-b was lost for good: hsx-d replaces it and finishes its shard 1 of 3
        {"hsx-a": {"hsx_num_shards": 3}, "hsx-c": {"hsx_num_shards": 3}, "hsx-d": {"hsx_shard_index": 1, "hsx_num_shards": 3}},
        {"one": {}},
    ],
    ids=["sorted-group", "replacement-host", "single"],
)
def test_each_host_gets_its_shard_in_the_rendered_config(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> None:
    inventory = write_inventory(tmp_path / "inventory", hosts)
    configs = rendered_configs(tmp_path, inventory)
    expected = package_rule(hosts)
    assert {h: (c["shard_index"], c["num_shards"]) for h, c in configs.items()} == expected
    assert sorted(index for index, _ in expected.values()) == list(range(len(hosts)))
    if PACKAGE_PYTHON.exists():  # the rendered file is what ExtractConfig accepts
        for config in configs.values():
            check = (
                "import json, sys; from hsextract.extract.config import ExtractConfig; "
                "ExtractConfig.model_validate(json.loads(sys.argv[1]))"
            )
            subprocess.run([str(PACKAGE_PYTHON), "-c", check, json.dumps(config)], check=True)


def test_two_hosts_on_one_shard_stop_the_preflight(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", {"a": {"hsx_shard_index": 1}, "b": {"hsx_shard_index": 1}})
    result = run_playbook("playbooks/preflight.yml", inventory)
    assert result.rc != 0
    assert "shard indices" in result.output and "must be distinct" in result.output


def test_a_failed_container_does_not_stop_the_others_and_is_named(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", {"hsx-a": {}, "hsx-b": {}, "hsx-c": {}})
    playbook = tmp_path / "fleet.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: extraction_containers
          gather_facts: false
          tasks:
            - ansible.builtin.fail:
                msg: broken
              when: inventory_hostname == 'hsx-b'
            - ansible.builtin.copy:
                content: done
                dest: "{tmp_path}/{{{{ inventory_hostname }}}}.done"
                mode: "0644"
            - ansible.builtin.include_tasks: {REPO}/playbooks/tasks/fail-if-hosts-failed.yml
        """)
    )
    result = run_playbook(str(playbook), inventory)
    assert result.rc != 0
    assert sorted(p.stem for p in tmp_path.glob("*.done")) == ["hsx-a", "hsx-c"]
    assert "1 of 3 containers failed: hsx-b" in result.output and "--limit hsx-b" in result.output


MULTINODE = {
    # one SGLang server over two containers (node 0 extracts and holds a shard), and a one-node server
    "big-0": {"hsx_nnodes": 2, "hsx_node_rank": 0, "hsx_dist_init_addr": "10.0.0.11:29500", "hsx_tp_size": 16},
    "big-1": {"hsx_nnodes": 2, "hsx_node_rank": 1, "hsx_dist_init_addr": "10.0.0.11:29500", "hsx_tp_size": 16},
    "solo": {},
}


def test_a_server_over_two_nodes_renders_each_nodes_flags_and_one_shard(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", MULTINODE)
    playbook = tmp_path / "render.yml"
    # the role's own defaults and vars, with what deploy.yml passes to it in between (later files win)
    passed = tmp_path / "passed.yml"
    passed.write_text(
        textwrap.dedent("""\
        hsx_server_runtime: venv
        hsx_server_model_path: "{{ hsx_model_path }}"
        hsx_server_tp_size: "{{ hsx_tp_size }}"
        hsx_server_nnodes: "{{ hsx_nnodes_effective }}"
        hsx_server_node_rank: "{{ hsx_node_rank_effective }}"
        hsx_server_dist_init_addr: "{{ hsx_dist_init_addr_effective }}"
        hsx_server_config_extra: {num_hidden_layers: 61, architecture: deepseek}
        """)
    )
    role = REPO / "roles" / "hsx_server"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: extraction_containers
          gather_facts: false
          vars_files: [{role}/defaults/main.yml, {REPO}/playbooks/vars/deploy.yml, {passed}, {role}/vars/main.yml]
          tasks:
            - ansible.builtin.copy:
                content: "{{{{ {{'server': _hsx_server_config, 'waits': _hsx_server_serves_http | bool,
                  'shard': hsx_shard_map.get(inventory_hostname)}} | to_json }}}}"
                dest: "{tmp_path}/{{{{ inventory_hostname }}}}.json"
                mode: "0644"
        """)
    )
    result = run_playbook(str(playbook), inventory)
    assert result.rc == 0, result.output
    rendered = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert {h: r["shard"] for h, r in rendered.items()} == {"big-0": 0, "big-1": None, "solo": 1}
    assert {h: (s, 2) for h, s in (("big-0", 0), ("solo", 1))} == package_rule(MULTINODE)
    assert [rendered[h]["waits"] for h in ("big-0", "big-1", "solo")] == [True, False, True]
    assert "nnodes" not in rendered["solo"]["server"]
    code = (
        "import json, sys; from hsextract.capture.sglang.config import SGLangLaunchConfig; "
        "from hsextract.capture.sglang.launcher import build_command; "
        "print(json.dumps(build_command(SGLangLaunchConfig.model_validate(json.loads(sys.argv[1])))))"
    )
    for rank in (0, 1):
        server = rendered[f"big-{rank}"]["server"]
        assert (server["nnodes"], server["node_rank"], server["dist_init_addr"]) == (2, rank, "10.0.0.11:29500")
        done = subprocess.run([str(PACKAGE_PYTHON), "-c", code, json.dumps(server)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        argv = json.loads(done.stdout)
        at = argv.index("--nnodes")
        assert argv[at : at + 6] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.0.0.11:29500"]
