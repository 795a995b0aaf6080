"""The monitoring role (roles/hsx_monitoring) against this machine (connection local) with scratch directories:
Prometheus config rendered from a two-container inventory and checked with the real promtool, the rules
(the alerts rendered from their template: the defaults give the repository's copy, other settings change
what fires, checked by promtool's unit tests), the Grafana dashboard and its provisioning file, check mode,
a config promtool rejects, bad alert settings, the second run."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import ANSIBLE_BIN, REPO, ansible_env, run_playbook

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MONITORING = REPO / "monitoring"
RULES = sorted((MONITORING / "prometheus" / "rules").glob("*.yml"))
RULE_TEMPLATES = sorted((MONITORING / "prometheus" / "rules").glob("*.yml.j2"))
RUNBOOKS = REPO / "docs" / "runbooks"

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

    # the recording rules copied, the alerts rendered from their template: with the role's defaults both are
    # byte for byte the repository's files (the alerts file there is the defaults rendering)
    assert sorted(p.name for p in scratch["rules"].iterdir()) == [p.name for p in RULES]
    for rules in RULES:
        assert (scratch["rules"] / rules.name).read_bytes() == rules.read_bytes(), (
            f"{rules.name}: the role's rendering with its defaults differs from the repository's copy;"
            " run `make monitoring-rules` after editing a rules template"
        )

    assert (scratch["dashboards"] / "hsextract.json").read_bytes() == (MONITORING / "grafana/hsextract.json").read_bytes()
    provisioning = yaml.safe_load((scratch["provisioning"] / "hsextract.yml").read_text())
    example = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/hsextract.yml").read_text())
    example["providers"][0]["options"]["path"] = str(scratch["dashboards"])
    assert provisioning == example

    # second run: nothing changes
    result = run_playbook(playbook, inventory)
    assert result.rc == 0, result.output
    assert result.recap()["mon-scratch"]["changed"] == 0


def test_make_monitoring_rules_renders_the_repository_s_copy(tmp_path: Path) -> None:
    """`make monitoring-rules`, run after editing a rules template, writes what the repository holds."""
    assert RULE_TEMPLATES, "no rules templates (*.yml.j2) under monitoring/prometheus/rules"
    done = subprocess.run(
        ["make", "-s", "monitoring-rules", f"MONITORING_RULES_DIR={tmp_path}", f"ANSIBLE_VENV={ANSIBLE_BIN.parent}"],
        cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for template in RULE_TEMPLATES:
        name = template.name.removesuffix(".j2")
        assert (tmp_path / name).read_bytes() == (template.parent / name).read_bytes(), (
            f"monitoring/prometheus/rules/{name} is stale: run `make monitoring-rules` and commit it"
        )


ALERT_SETTINGS = Path(__file__).parent / "data" / "alert-settings.yml"
ALERT_SETTINGS_TESTS = Path(__file__).parent / "data" / "alert-settings.test.yml"


def test_the_alert_settings_reach_the_installed_rules(scratch: dict[str, Path], promtool: str) -> None:
    result = run_playbook(str(scratch["playbook"]), scratch["inventory"], "-e", f"@{ALERT_SETTINGS}")
    assert result.rc == 0, result.output

    base = yaml.safe_load(ALERT_SETTINGS.read_text())["hsx_monitoring_runbook_base_url"].rstrip("/")
    alerts = yaml.safe_load((scratch["rules"] / "hsextract.alerts.yml").read_text())
    rules = [rule for group in alerts["groups"] for rule in group["rules"]]
    shipped = yaml.safe_load((MONITORING / "prometheus/rules/hsextract.alerts.yml").read_text())
    assert [r["alert"] for r in rules] == [r["alert"] for g in shipped["groups"] for r in g["rules"]]  # every alert installed
    assert len(rules) >= 13
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base + "/"), f"{rule['alert']}: {url}"
        assert (RUNBOOKS / url.removeprefix(base + "/")).is_file(), f"{rule['alert']}: {url}"

    # each case fires because of its setting: it passes on the rules installed here ...
    shutil.copy(ALERT_SETTINGS_TESTS, scratch["config"] / "settings.test.yml")
    argv = [promtool, "test", "rules", "settings.test.yml"]
    check = subprocess.run(argv, cwd=scratch["config"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # ... and fails on the defaults rendering (the repository's copy)
    shutil.copy(MONITORING / "prometheus/rules/hsextract.alerts.yml", scratch["rules"] / "hsextract.alerts.yml")
    check = subprocess.run(argv, cwd=scratch["config"], capture_output=True, text=True, timeout=60)
    assert check.returncode != 0
    cases = [case["name"] for case in yaml.safe_load(ALERT_SETTINGS_TESTS.read_text())["tests"]]
    assert len(cases) == 8
    for case in cases:
        assert f"name: {case}," in check.stdout + check.stderr, case


OUT_OF_RANGE = "hsx_monitoring: the alert settings are out of range"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("hsx_monitoring_alert_stalled_minutes=5", OUT_OF_RANGE),
        ("hsx_monitoring_alert_stalled_quiet_minutes=-1", OUT_OF_RANGE),
        ("hsx_monitoring_alert_regen_stalled_minutes=5", OUT_OF_RANGE),
        ("hsx_monitoring_alert_regen_quiet_minutes=-1", OUT_OF_RANGE),
        ("hsx_monitoring_alert_shm_ratio=1.5", OUT_OF_RANGE),
        ("hsx_monitoring_alert_error_ratio=0", OUT_OF_RANGE),
        ("hsx_monitoring_runbook_base_url=''", OUT_OF_RANGE),
        # argument_specs.yml: the role's types are checked before its first task
        ("hsx_monitoring_alert_sglang_down_minutes=soon", "'hsx_monitoring_alert_sglang_down_minutes' is of type str"),
    ],
)
def test_a_bad_alert_setting_stops_before_any_file(scratch: dict[str, Path], setting: str, message: str) -> None:
    result = run_playbook(str(scratch["playbook"]), scratch["inventory"], "-e", setting)
    assert result.rc != 0
    assert message in result.output, result.output[-3000:]
    assert not scratch["config"].exists()


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


def _scrape_jobs_with(scratch: dict[str, Path], promtool: str, host: str, **settings: object) -> dict[str, Any]:
    """Run the role with ``settings`` added to ``host`` in the inventory; the rendered prometheus.yml's scrape
    jobs by name, after promtool accepted the file."""
    inventory = yaml.safe_load(scratch["inventory"].read_text())
    hosts = inventory["all"]["children"]["extraction_containers"]["hosts"]
    hosts[host] = {**hosts[host], **settings}
    scratch["inventory"].write_text(yaml.safe_dump(inventory))
    result = run_playbook(str(scratch["playbook"]), scratch["inventory"])
    assert result.rc == 0, result.output
    config = scratch["config"] / "prometheus.yml"
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return {job["job_name"]: job for job in yaml.safe_load(config.read_text())["scrape_configs"]}


def test_an_embedded_server_is_scraped_under_its_own_job_not_sglang(scratch: dict[str, Path], promtool: str) -> None:
    """hsextract serve answers /metrics (its capture stages): under job sglang it would show SGLang up with
    empty SGLang panels, so it has its own job, hsextract_server."""
    jobs = _scrape_jobs_with(scratch, promtool, "hsx-b", hsx_server_runtime="embedded")
    assert list(jobs) == ["hsextract", "sglang", "hsextract_server"]
    targets = {job: [t for sc in jobs[job]["static_configs"] for t in sc["targets"]] for job in jobs}
    assert targets["sglang"] == ["10.0.3.10:30000"] and targets["hsextract_server"] == ["[fd00::11]:30001"]
    assert jobs["hsextract_server"]["static_configs"][0]["labels"] == {"container": "hsx-b", "shard": "1"}


def test_a_regeneration_job_is_scraped_under_job_hsextract_at_its_own_port(scratch: dict[str, Path], promtool: str) -> None:
    """make regenerate's job serves hsextract_regen_* on hsx_regen_metrics_port: the regeneration alerts and the
    dashboard's Regeneration row read them from job hsextract, beside the extractor's port."""
    jobs = _scrape_jobs_with(scratch, promtool, "hsx-a", hsx_regen_metrics_port=9411)
    got = {t: sc["labels"] for sc in jobs["hsextract"]["static_configs"] for t in sc["targets"]}
    regen = {t: labels for t, labels in got.items() if t.endswith(":9411")}
    assert list(regen.values()) == [{"container": "hsx-a", "shard": "0"}], got
    assert len(got) == len(EXPECTED_TARGETS["hsextract"]) + 1  # the extractors' targets stay as they were
