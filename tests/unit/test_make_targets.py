"""The make targets a user of this machine runs (issue 29 item 12): `make extract` takes the paths a user needs
(DATASET, PREPARED, OUTPUT), `make clean` removes only work/ (the venvs have `make clean-venvs`), and each run of
the default keeps the server logs of the runs before it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from .answering_http import answering

ROOT = Path(__file__).resolve().parents[2]


def _make_dry_run(*args: str) -> str:
    done = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True)
    return done.stdout


def test_clean_removes_only_work_and_the_venvs_have_their_own_target() -> None:
    clean = [line for line in _make_dry_run("clean").splitlines() if line.startswith("rm ")]
    assert clean == ["rm -rf work"]
    venvs = [line for line in _make_dry_run("clean-venvs").splitlines() if line.startswith("rm ")]
    assert venvs == ["rm -rf .venv .venv-sglang .venv-trainers .venv-ansible"]


def test_extract_passes_the_users_paths_to_the_default_run() -> None:
    line = next(
        line for line in _make_dry_run("extract", "OUTPUT=/data/out", "DATASET=/data/c.jsonl").splitlines()
        if "run-default.sh" in line
    )  # fmt: skip
    assert 'DATASET="/data/c.jsonl"' in line and 'OUTPUT="/data/out"' in line and 'PREPARED=""' in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_default_run_uses_those_paths_and_keeps_the_last_server_logs(tmp_path: Path) -> None:
    """scripts/run-default.sh in a copy of the checkout whose .venv/bin/hsextract records its arguments."""
    (tmp_path / "scripts").mkdir()
    for script in ("run-default.sh", "rotate-log.sh"):
        shutil.copy2(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    stub = tmp_path / ".venv" / "bin" / "hsextract"
    stub.parent.mkdir(parents=True)
    stub.write_text(
        '#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n[ "$1" = serve ] && echo "log of $HSX_RUN" && exec sleep 30\n'
        # the run ends (and stops its server) only once the server said its line: on a loaded machine the stop
        # came first and left an empty log
        '[ "$1" = extract ] && until grep -q "log of $HSX_RUN" "$WORK/server.log" 2>/dev/null; do sleep 0.05; done\n'
        "exit 0\n"
    )
    stub.chmod(0o755)
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text("{}\n")
    env = {**os.environ, "HSX_PORT": str(_free_port()), "DATASET": str(dataset), "PREPARED": str(tmp_path / "p"),
           "OUTPUT": str(tmp_path / "o"), "WORK": str(tmp_path / "work")}  # fmt: skip
    for run in range(5):
        (tmp_path / "o").mkdir(exist_ok=True)  # the stub writes no output; the script's last line cds into it
        done = subprocess.run([str(tmp_path / "scripts" / "run-default.sh")], env={**env, "HSX_RUN": str(run)},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
    calls = (stub.parent / "calls").read_text().splitlines()
    assert f"prepare --model {tmp_path}/work/model --dataset {dataset} --output {tmp_path}/p" in calls[1]
    assert any(c.startswith(f"extract --server http://127.0.0.1:{env['HSX_PORT']} --dataset {tmp_path}/p --output {tmp_path}/o")
               for c in calls)  # fmt: skip
    assert not any(c.startswith("make-sample-data") for c in calls)  # the user's dataset is never replaced
    logs = sorted(p.name for p in (tmp_path / "work").glob("server.log*"))
    assert logs == ["server.log", "server.log.1", "server.log.2", "server.log.3"]
    assert [(tmp_path / "work" / name).read_text().strip() for name in logs] == [
        "log of 4", "log of 3", "log of 2", "log of 1"
    ]


# -- issue 39 items 8 and 14: make status and make logs look where make extract runs ---------------------------------
def _make(target: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # -o: .venv is set up already; HSX_INVENTORY_CONFIGURED= and INVENTORY=: no inventory, this machine
    command = ["make", "-s", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.setup-done", target,
               "HSX_INVENTORY_CONFIGURED=", "INVENTORY=", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


METRICS = 'hsextract_samples_planned 2000\nhsextract_samples_total{status="ok"} 1007\nhsextract_running 1\n'


def test_make_status_takes_the_ports_and_output_make_extract_takes(tmp_path: Path) -> None:
    """`HSX_PORT=... HSX_METRICS_PORT=... make extract OUTPUT=...` running: make status said the server was down
    and showed the old work/output."""
    output = tmp_path / "mine"
    output.mkdir()
    with answering("ok") as server_port, answering(METRICS) as metrics_port:
        done = _make("status", f"OUTPUT={output}", f"WORK={tmp_path / 'work'}",
                     env={"HSX_PORT": str(server_port), "HSX_METRICS_PORT": str(metrics_port)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "server health (/health_generate): 200 OK" in done.stdout, done.stdout
    assert "extraction: running; 1007/2000 samples settled" in done.stdout, done.stdout
    assert f"{output} (on " in done.stdout and "work/output" not in done.stdout, done.stdout
    # WORK alone moves the output as it moves make extract's (WORK/output)
    port = str(_free_port())
    done = _make("status", f"WORK={tmp_path / 'work'}", env={"HSX_PORT": port, "HSX_METRICS_PORT": port})
    assert f"output {tmp_path / 'work' / 'output'}: no such directory" in done.stdout, done.stdout


def test_make_logs_without_an_inventory_shows_make_extracts_server_log(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "server.log").write_text("".join(f"server line {i}\n" for i in range(1, 81)))
    port = str(_free_port())
    done = _make("logs", f"WORK={work}", "LINES=5", env={"HSX_PORT": port, "HSX_METRICS_PORT": port})
    assert done.returncode == 0, done.stderr
    assert f"-- last log lines of {work}/server.log:" in done.stdout, done.stdout
    assert "server line 76" in done.stdout and "server line 80" in done.stdout, done.stdout
    assert "server line 75" not in done.stdout and "No entries" not in done.stdout, done.stdout
    assert "last log lines of hsextract-server" not in done.stdout, done.stdout


def test_bench_gpu_e2e_takes_the_models_shape_and_aux_layers_in_each_mode() -> None:
    for mode in ([], ["SOAK=1"], ["FP8=1"]):
        (line,) = (line for line in _make_dry_run("bench-gpu-e2e", *mode, "LAYERS=4", "HIDDEN=2048", "LAYER_IDS=0,1,2")
                   .splitlines() if "bench/bench_gpu_" in line)  # fmt: skip
        assert line.split()[-6:] == ["--layers", "4", "--hidden", "2048", "--layer-ids", "0,1,2"], (mode, line)
    (plain,) = (line for line in _make_dry_run("bench-gpu-e2e").splitlines() if "bench/bench_gpu_e2e.py" in line)
    assert "--layers" not in plain and "--layer-ids" not in plain  # the script's own defaults
