"""Prometheus config and rules: promtool's own checks, the unit tests, and what every alert must carry."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from .helpers import MONITORING, REPO, RULES, tool

PROMETHEUS_DIR = MONITORING / "prometheus"
ALERT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def rules_of(kind: str) -> list[dict[str, Any]]:
    found = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [rule for rule in group["rules"] if kind in rule]
    return found


def test_promtool_check_config() -> None:
    out = promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml")).stdout
    assert "SUCCESS" in out
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"hsextract", "sglang", "hsextract_server"}  # the embedded server: its own job, never sglang
    assert jobs["hsextract"]["static_configs"][0]["targets"][0].endswith(":9400")
    assert jobs["sglang"]["static_configs"][0]["targets"][0].endswith(":30000")
    assert jobs["hsextract_server"]["static_configs"][0]["targets"][0].endswith(":30000")


def test_promtool_check_rules() -> None:
    promtool("check", "rules", *map(str, RULES))


def test_promtool_rule_unit_tests() -> None:
    assert ALERT_TESTS, "no promtool unit tests under monitoring/prometheus/tests"
    promtool("test", "rules", *map(str, ALERT_TESTS))


def test_the_issue_s_alerts_exist() -> None:
    names = {rule["alert"] for rule in rules_of("alert")}
    assert {
        "HsextractExtractionStalled",
        "HsextractErrorRateHigh",
        "HsextractShmNearlyFull",
        "HsextractOutputDiskNearlyFull",
        "HsextractOutputDiskFillsBeforeEnd",
        "HsextractServerDown",
        "HsextractSGLangDown",
        "HsextractExtractorDown",
        "HsextractShardBehind",
        "HsextractRegenerationStalled",
        "HsextractRegenerationErrorRateHigh",
        "HsextractRegenerationServerDown",
    } <= names


def test_every_alert_has_summary_description_severity_and_an_existing_runbook() -> None:
    for rule in rules_of("alert"):
        name, annotations = rule["alert"], rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        url = annotations.get("runbook_url", "")
        assert url.startswith("docs/runbooks/") and url.endswith(".md"), f"{name}: runbook_url {url!r}"
        assert (REPO / url).is_file(), f"{name}: {url} does not exist"


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in ALERT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in rules_of("alert")}
    assert names - fired == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


def test_recording_rules_follow_the_naming_convention_and_are_all_used_or_documented() -> None:
    records = [rule["record"] for rule in rules_of("record")]
    assert len(records) == len(set(records))
    for name in records:
        level, metric, _ = name.split(":")
        assert level in ("instance", "job") and metric.startswith("hsextract_"), name  # job: the fleet of shards
    used = " ".join(rule["expr"] for rule in rules_of("alert") + rules_of("record"))
    for name in (
        "instance:hsextract_eta:seconds",
        "instance:hsextract_samples_remaining:sum",
        "instance:hsextract_regen_rows_remaining:sum",
        "instance:hsextract_regen_error_ratio:rate5m",
    ):
        assert name in used
