"""The Grafana dashboard: valid JSON, unique ids, uid and title, a datasource variable, no hard-coded
instance, and every query valid PromQL (parsed by promtool, offline)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import yaml

from .helpers import DASHBOARD, dashboard, dashboard_panels, dashboard_queries, substitute, tool

REQUIRED = {
    "samples/s": "hsextract_samples_total",
    "tokens/s": "hsextract_tokens_total",
    "progress": "hsextract_samples_planned",
    "ETA": "hsextract_tokens_planned",
    "errors by reason": "hsextract_errors_total",
    "/dev/shm used": "hsextract_shm_used_bytes",
    "/dev/shm total": "hsextract_shm_total_bytes",
    "disk free": "hsextract_disk_free_bytes",
    "time to full": "hsextract_output_bytes_total",
    "in-flight": "hsextract_inflight_requests",
    "latency": "hsextract_request_seconds_bucket",
    "oldest open request": "hsextract_oldest_open_request_seconds",
    "late answers": "hsextract_late_answers_total",
    "watchdog resends": "hsextract_watchdog_resends_total",
    "server up": "hsextract_server_up",
    "SGLang prompt throughput": "sglang:prompt_tokens_total",
    "SGLang queue": "sglang:num_queue_reqs",
    # the embedded server's capture stages (README: which resource is the limit), under its own job
    "server stage time": 'hsextract_server_stage_seconds_sum{job="hsextract_server", instance=~"$server_instance"}',
    "server stage p99": 'hsextract_server_stage_seconds_bucket{job="hsextract_server", instance=~"$server_instance"}',
    "server padding": "hsextract_server_padded_tokens_total",
    "server dump bytes": "hsextract_server_dump_bytes_total",
}


def test_dashboard_is_valid_json_with_uid_title_and_unique_panel_ids() -> None:
    data = dashboard()  # raises on invalid JSON
    assert data["uid"] == "hsextract-extraction" and len(data["uid"]) <= 40
    assert data["title"]
    ids = [p["id"] for p in dashboard_panels()]
    assert all(isinstance(i, int) for i in ids)
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    assert DASHBOARD.read_text().endswith("\n")


def test_dashboard_has_a_datasource_variable_used_by_every_panel_and_target() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for name in ("instance", "sglang_instance", "server_instance"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    # the embedded server's targets: its own job (monitoring/prometheus/prometheus.yml), never sglang
    assert variables["server_instance"]["definition"] == 'label_values(up{job="hsextract_server"}, instance)'


def test_no_hard_coded_instance() -> None:
    text = DASHBOARD.read_text()
    assert "127.0.0.1" not in text and "localhost" not in text
    for title, expr in dashboard_queries():
        assert 'instance="' not in expr, title
        assert any(f'instance=~"${name}"' in expr for name in ("instance", "sglang_instance", "server_instance")), (
            f"{title}: {expr}"
        )


def test_every_panel_the_issue_asks_for_is_there() -> None:
    queries = " ".join(expr for _, expr in dashboard_queries())
    titles = " ".join(p["title"].lower() for p in dashboard_panels())
    for what, metric in REQUIRED.items():
        assert metric in queries, f"no panel queries {metric} ({what})"
    # bf16 and FP8 outputs (--storage float8_e4m3fn) differ by half here: the storage shows on the dashboard
    assert (
        "rate(hsextract_output_bytes_total" in queries
        and ") / sum by (instance, container) (rate(hsextract_tokens_total" in queries
    )
    for word in (
        "samples/s",
        "tokens/s",
        "progress",
        "eta",
        "errors by reason",
        "/dev/shm",
        "disk free",
        "time to full",
        "in-flight",
        "p50",
        "p99",
        "oldest open request",
        "late answers",
        "server up",
        "prompt throughput",
        "queue",
        "bytes per token",
    ):
        assert word in titles, f"no panel titled with {word!r}"


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool check rules parses each query (Grafana's variables substituted) as a recording rule."""
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": substitute(expr)} for i, (_, expr) in enumerate(dashboard_queries())
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":  # label_values(<selector>, label): the selector must parse
            definition = variable["definition"]
            assert definition.startswith("label_values(") and definition.endswith(")")
            selector = definition[len("label_values(") : definition.rindex(",")]
            rules.append({"record": f"dashboard:variable_{variable['name']}:check", "expr": selector})
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
