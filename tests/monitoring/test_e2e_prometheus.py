"""End to end: a real Prometheus (Debian's) scrapes a real extraction on the embedded default.

While the run goes (Prometheus scrapes the extractor, and a regeneration against the same server, as
job hsextract and the embedded server as job hsextract_server): the extractor's `up` is 1, every
dashboard query and every recording rule returns data (SGLang's panels only parse: no SGLang runs here;
the Regeneration row's panels get theirs from the regeneration). Then the server is killed mid-run: the
production rules put HsextractServerDown into pending (their `for:` durations are unit-tested with
promtool), the extractor waits ``--server-down-timeout-s`` for it, gives up and `up` turns 0. Then
the run is resumed against a new server and the extractor is killed: HsextractExtractorDown goes
pending, HsextractServerDown has resolved.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hsextract.dev.sample_data import make_sample_conversations, make_sample_data

from ..helpers import free_port
from .helpers import RULES, Prometheus, dashboard_queries, is_sglang_only, substitute

ROWS = 4000  # far more than the test waits for: the run must still be going while the queries are checked
ACTIVE = ("pending", "firing")
#: how long the extractor waits for its killed server before it gives up (30 min by default)
SERVER_DOWN_TIMEOUT_S = 15


class Processes:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        process = subprocess.Popen([sys.executable, "-m", "hsextract", *args], stdout=log, stderr=subprocess.STDOUT)
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text()[-3000:]

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def dump_dir() -> Iterator[Path]:
    path = Path(f"/dev/shm/hsx-e2e-test-{os.getpid()}")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dataset_with_bad_rows(path: Path) -> Path:
    make_sample_data(path, ROWS, vocab_size=1024, seed=3)
    lines = path.read_text().splitlines()
    lines[1] = "not json"
    lines[3] = '{"input_ids": []}'
    path.write_text("\n".join(lines) + "\n")
    return path


def value(prom: Prometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


def recorded_series() -> list[str]:
    names = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [rule["record"] for rule in group["rules"] if "record" in rule]
    return names


def test_prometheus_scrapes_a_real_extraction(
    model_dir: Any, tmp_path: Path, dump_dir: Path, processes: Processes, prometheus: Callable[..., Prometheus]
) -> None:
    # the model `hsextract make-tiny-model --hidden 64 --layers 8 --dtype float32` writes (vocabulary 1024)
    model = str(model_dir())
    dataset = dataset_with_bad_rows(tmp_path / "data.jsonl")
    output = tmp_path / "output"
    server_port, metrics_port = free_port(), free_port()
    instance = f"127.0.0.1:{metrics_port}"

    def extract(name: str, port: int) -> subprocess.Popen[bytes]:
        return processes.start(
            name, "extract", "--server", f"http://127.0.0.1:{port}", "--dataset", str(dataset), "--output", str(output),
            "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1", "--max-seq-len", "256",
            "--concurrency", "2", "--health-timeout-s", "180", "--log-interval-s", "5",
            "--server-down-timeout-s", str(SERVER_DOWN_TIMEOUT_S),
        )  # fmt: skip

    server = processes.start("server", "serve", "--model", model, "--dump-dir", str(dump_dir), "--port", str(server_port))
    server_instance = f"127.0.0.1:{server_port}"  # the embedded server's /metrics: its capture stages
    regen_port = free_port()
    regen_instance = f"127.0.0.1:{regen_port}"  # hsextract regenerate on the same server: the Regeneration row
    prom = prometheus({"hsextract": [instance, regen_instance], "hsextract_server": [server_instance]})
    extractor = extract("extract", server_port)
    processes.start(
        "regenerate", "regenerate", "--server", f"http://127.0.0.1:{server_port}", "--model", model,
        "--dataset", str(make_sample_conversations(tmp_path / "conversations.jsonl", num=ROWS, seed=4)),
        "--output", str(tmp_path / "regenerated.jsonl"), "--max-new-tokens", "8", "--concurrency", "2",
        "--metrics-port", str(regen_port), "--metrics-host", "127.0.0.1", "--health-timeout-s", "180", "--no-progress",
    )  # fmt: skip
    up = f'up{{job="hsextract", instance="{instance}"}}'

    # -- while it runs: up, every dashboard query, every recording rule ------------------------------
    prom.wait_for("the extractor's up to be 1", lambda: value(prom, up) == 1, timeout_s=240)
    queries = [
        (title, substitute(expr, instance=f"{instance}|{regen_instance}", server_instance=server_instance))
        for title, expr in dashboard_queries()
    ]
    waiting = {(title, expr) for title, expr in queries if not is_sglang_only(expr)}
    # instance: rules carry the extractor's instance (instance:hsextract_regen_ ones the regeneration's); job: rules
    # (the fleet's sums) only its job
    def rule_query(name: str) -> str:
        if name.startswith("job:"):
            return f'{name}{{job="hsextract"}}'
        return f'{name}{{instance="{regen_instance if name.startswith("instance:hsextract_regen_") else instance}"}}'

    waiting |= {(name, rule_query(name)) for name in recorded_series()}

    def all_have_data() -> bool:
        assert extractor.poll() is None, "the extraction ended before every query had data:\n" + processes.log("extract")
        for item in sorted(waiting):
            if prom.query(item[1]):
                waiting.discard(item)
        return not waiting

    try:
        prom.wait_for("data for every dashboard query and recording rule", all_have_data, timeout_s=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still without data: {sorted(waiting)}") from None
    for _, expr in queries:
        if is_sglang_only(expr):
            prom.query(expr)  # parses (no SGLang here: no data expected)
    progress = value(prom, f'instance:hsextract_progress:ratio{{instance="{instance}"}}')
    assert progress is not None and 0 < progress < 1
    assert value(prom, f'sum(hsextract_errors_total{{instance="{instance}"}})') == 2  # the two bad rows
    # a healthy run raises nothing about the run itself (the two bad rows may count as an error rate)
    assert set(prom.alerts()) <= {"HsextractErrorRateHigh"}, prom.alerts()

    # -- the server dies mid-run: HsextractServerDown, the extractor waits for it, gives up, up turns 0 --
    server.send_signal(signal.SIGKILL)
    server.wait()
    prom.wait_for("HsextractServerDown pending", lambda: prom.alerts().get("HsextractServerDown") in ACTIVE, timeout_s=60)
    assert extractor.wait(timeout=180) == 1, processes.log("extract")  # fatal stop: the server stayed away
    assert f"did not come back within {SERVER_DOWN_TIMEOUT_S} s" in processes.log("extract")
    prom.wait_for("the extractor's up to turn 0", lambda: value(prom, up) == 0, timeout_s=30)
    assert prom.alerts().get("HsextractServerDown") in ACTIVE  # the last thing the extractor saw

    # -- resume against a new server; then the extractor crashes: HsextractExtractorDown -------------
    new_port = free_port()
    processes.start("server2", "serve", "--model", model, "--dump-dir", str(dump_dir), "--port", str(new_port))
    resumed = extract("extract2", new_port)
    prom.wait_for("the resumed extractor's up", lambda: value(prom, up) == 1, timeout_s=240)
    done_before = value(prom, f'hsextract_samples_total{{instance="{instance}", status="resumed"}}')
    assert done_before is not None and done_before > 0
    prom.wait_for("HsextractServerDown to resolve", lambda: "HsextractServerDown" not in prom.alerts(), timeout_s=60)
    written = f'hsextract_samples_total{{instance="{instance}", status="ok"}}'
    prom.wait_for("a sample written after resuming", lambda: (value(prom, written) or 0) > 0)
    resumed.send_signal(signal.SIGKILL)
    resumed.wait()
    prom.wait_for("the extractor's up to turn 0", lambda: value(prom, up) == 0, timeout_s=30)
    prom.wait_for("HsextractExtractorDown pending", lambda: prom.alerts().get("HsextractExtractorDown") in ACTIVE, timeout_s=30)
