"""The make targets a user of this machine runs (issue 29 item 12): `make extract` takes the paths a user needs
(DATASET, PREPARED, OUTPUT), `make clean` removes only work/ (the venvs have `make clean-venvs`), and each run of
the default keeps the server logs of the runs before it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

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
        '#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n[ "$1" = serve ] && echo "log of $HSX_RUN" && exec sleep 30\nexit 0\n'
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
