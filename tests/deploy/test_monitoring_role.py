"""The monitoring role (roles/hsx_monitoring) against this machine (connection local) with scratch directories:
Prometheus config rendered from a two-container inventory and checked with the real promtool, the rules,
the Grafana dashboard and its provisioning file, check mode, a config promtool rejects, the second run."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from .conftest import ANSIBLE_BIN, REPO, run_playbook

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MONITORING = REPO / "monitoring"
RULES = sorted((MONITORING / "prometheus" / "rules").glob("*.yml"))

#: the extraction containers Prometheus scrapes: one at the default ports, one at others and on IPv6
CONTAINERS = {
    "hsx-a": {"ansible_host": "10.0.3.10", "hsx_metrics_port": 9400, "hsx_server_port": 30000},
    "hsx-b": {"ansible_host": "fd00::11", "hsx_metrics_port": 9401, "hsx_server_port": 30001},
}
EXPECTED_TARGETS = {
    "hsextract": {"10.0.3.10:9400": "hsx-a", "[fd00::11]:9401": "hsx-b"},
    "sglang": {"10.0.3.10:30000": "hsx-a", "[fd00::11]:30001": "hsx-b"},
}


@pytest.fixture(scope="module")
def promtool() -> str:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool is missing: run scripts/monitoring/install-deps.sh (make monitoring-deps)")
    return PROMTOOL


@pytest.fixture
def scratch(tmp_path: Path, promtool: str) -> dict[str, Path]:
    dirs = {
        "config": tmp_path / "etc-prometheus",
        "rules": tmp_path / "etc-prometheus" / "rules",
        "dashboards": tmp_path / "grafana-dashboards",
        "provisioning": tmp_path / "grafana-provisioning",
    }
    python = str(ANSIBLE_BIN / "python")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "extraction_containers": {"hosts": CONTAINERS},
                        "monitoring": {
                            "hosts": {"mon-scratch": {"ansible_connection": "local", "ansible_python_interpreter": python}}
                        },
                    }
                }
            }
        )
    )
    playbook = tmp_path / "monitoring.yml"
    playbook.write_text(
        textwrap.dedent(f"""\
        - hosts: monitoring
          gather_facts: false
          roles:
            - role: {REPO}/roles/hsx_monitoring
              vars:
                hsx_monitoring_install_prometheus: false
                hsx_monitoring_prometheus_systemd: false
                hsx_monitoring_prometheus_reload: false
                hsx_monitoring_promtool: {promtool}
                hsx_monitoring_prometheus_config_dir: {dirs["config"]}
                hsx_monitoring_prometheus_rules_dir: {dirs["rules"]}
                hsx_monitoring_grafana_dashboards_dir: {dirs["dashboards"]}
                hsx_monitoring_grafana_provisioning_dir: {dirs["provisioning"]}
        """)
    )
    return {**dirs, "inventory": inventory, "playbook": playbook}


def test_monitoring_role_on_scratch_dirs(scratch: dict[str, Path], promtool: str):
    playbook, inventory = str(scratch["playbook"]), scratch["inventory"]
    # check mode: nothing written
    result = run_playbook(playbook, inventory, "--check")
    assert result.rc == 0, result.output
    assert not scratch["config"].exists()
    assert not scratch["dashboards"].exists()

    result = run_playbook(playbook, inventory)
    assert result.rc == 0, result.output
    assert result.recap()["mon-scratch"]["failed"] == 0

    config = scratch["config"] / "prometheus.yml"
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # promtool also found and checked every rules file the config names
    for rules in RULES:
        assert str(scratch["rules"] / rules.name) in check.stdout + check.stderr

    rendered = yaml.safe_load(config.read_text())
    assert rendered["rule_files"] == [f"{scratch['rules']}/*.yml"]
    assert rendered["global"]["scrape_interval"] == "15s"
    assert "alerting" not in rendered
    jobs = {job["job_name"]: job for job in rendered["scrape_configs"]}
    assert list(jobs) == ["hsextract", "sglang"]
    for job, expected in EXPECTED_TARGETS.items():
        got = {target: sc["labels"]["container"] for sc in jobs[job]["static_configs"] for target in sc["targets"]}
        assert got == expected, job
        shards = {sc["labels"]["container"]: sc["labels"]["shard"] for sc in jobs[job]["static_configs"]}
        assert shards == {"hsx-a": "0", "hsx-b": "1"}, job  # the sorted group, as deploy.yml renders the extractors'

    assert sorted(p.name for p in scratch["rules"].iterdir()) == [p.name for p in RULES]
    for rules in RULES:
        assert (scratch["rules"] / rules.name).read_bytes() == rules.read_bytes()

    assert (scratch["dashboards"] / "hsextract.json").read_bytes() == (MONITORING / "grafana/hsextract.json").read_bytes()
    provisioning = yaml.safe_load((scratch["provisioning"] / "hsextract.yml").read_text())
    example = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/hsextract.yml").read_text())
    example["providers"][0]["options"]["path"] = str(scratch["dashboards"])
    assert provisioning == example

    # second run: nothing changes
    result = run_playbook(playbook, inventory)
    assert result.rc == 0, result.output
    assert result.recap()["mon-scratch"]["changed"] == 0


def test_a_config_promtool_rejects_leaves_the_live_one(scratch: dict[str, Path]):
    playbook, inventory = str(scratch["playbook"]), scratch["inventory"]
    result = run_playbook(playbook, inventory)
    assert result.rc == 0, result.output
    live = (scratch["config"] / "prometheus.yml").read_text()
    result = run_playbook(playbook, inventory, "-e", "hsx_monitoring_scrape_interval=fifteen")
    assert result.rc != 0
    assert "failed to validate" in result.output
    assert (scratch["config"] / "prometheus.yml").read_text() == live


def test_no_targets_stops_with_a_message(scratch: dict[str, Path]):
    result = run_playbook(str(scratch["playbook"]), scratch["inventory"], "-e", "hsx_monitoring_targets_group=nothing")
    assert result.rc != 0
    assert "the inventory has\nnone" in result.output or "the inventory has none" in result.output
    assert not scratch["config"].exists()


def test_deploy_has_a_monitoring_play_and_the_example_group_is_empty():
    plays = yaml.safe_load((REPO / "deploy.yml").read_text())
    assert plays[-1]["hosts"] == "monitoring"
    assert [r["role"] for r in plays[-1]["roles"]] == ["hsx_monitoring"]
    groups = yaml.safe_load((REPO / "inventory/example/hosts.yml").read_text())["all"]["children"]
    assert not (groups["monitoring"] or {}).get("hosts")
