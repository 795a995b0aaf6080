"""A fleet of two shards seen as one: `make status` (every shard and the TOTAL) and `make merge` (the outputs
gathered over SSH, or taken in place on a shared filesystem, then merged and verified).

The two "hosts" are two real extractions (shard 0/2 and 1/2) on a real embedded server, each still serving
its /metrics; they are reached through a real sshd on 127.0.0.1 via an inventory `ansible-inventory` resolves.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hsextract.capture.embedded import Engine
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.front import HttpFront
from hsextract.dev.sample_data import make_sample_data
from hsextract.output.verify import verify_output

from ..helpers import free_port, run_extraction
from .helpers import SSHServer
from .test_status import ansible_venv, make_status, write_inventory  # noqa: F401 - ansible_venv is a fixture

ROWS = 9
SSH_OPTIONS = "--ssh-option StrictHostKeyChecking=no --ssh-option UserKnownHostsFile=/dev/null"


@dataclass
class Shard:
    index: int
    metrics_port: int
    output: Path
    samples: int
    tokens: int


@dataclass
class Fleet:
    server_port: int
    dump_dir: Path
    shards: list[Shard]


@pytest.fixture(scope="module")
def fleet(model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    dump_dir = Path(f"/dev/shm/hsx-fleet-test-{os.getpid()}")
    engine = Engine(ServeConfig(model=model_dir(), dump_dir=dump_dir))
    server = HttpFront(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dataset = make_sample_data(work / "data.jsonl", ROWS, vocab_size=1024, seed=3)
    shards = []
    for index in range(2):
        port = free_port()
        summary = run_extraction(
            f"http://127.0.0.1:{server.port}",
            dataset,
            work / f"host{index}" / "output",
            shard_index=index,
            num_shards=2,
            metrics_port=port,
            metrics_host="127.0.0.1",
            format="speculators",
        )
        assert summary.status == "complete"
        shards.append(Shard(index, port, summary.output, summary.total_samples, summary.total_tokens))
    yield Fleet(server.port, dump_dir, shards)
    server.shutdown()
    shutil.rmtree(dump_dir, ignore_errors=True)


def fleet_inventory(path: Path, sshd: SSHServer, fleet: Fleet, extra: dict[str, dict[str, Any]] | None = None) -> Path:
    hosts = {}
    for shard in fleet.shards:  # named so that the sorted order gives shard i to host i
        hosts[f"hsx-{shard.index}"] = {
            "ansible_host": "127.0.0.1",
            "ansible_port": sshd.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(sshd.client_key),
            "hsx_server_port": fleet.server_port,
            "hsx_metrics_port": shard.metrics_port,
            "hsx_output_dir": str(shard.output),
            "hsx_dump_dir": str(fleet.dump_dir),
        }
    hosts.update(extra or {})
    return write_inventory(path, hosts)


@pytest.mark.usefixtures("ansible_venv")
def test_make_status_shows_every_shard_and_the_total(fleet: Fleet, sshd: SSHServer, tmp_path: Path) -> None:
    inventory = fleet_inventory(tmp_path / "inventory", sshd, fleet)
    done = make_status(f"INVENTORY={inventory}", "STATUS_ARGS=--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(h["name"], h["shard_index"], h["num_shards"]) for h in report["hosts"]] == [("hsx-0", 0, 2), ("hsx-1", 1, 2)]
    total = report["total"]
    configs = [json.loads((s.output / "data_config.json").read_text()) for s in fleet.shards]
    assert total["settled"] == total["planned"] == ROWS == sum(c["rows_in_shard"] for c in configs)
    assert total["tokens"] == total["tokens_planned"] == sum(c["total_tokens"] for c in configs)
    assert total["eta_s"] == 0 and total["slowest"] is None and total["running"] == 0 and total["errors"] == 0

    text = make_status(f"INVENTORY={inventory}")
    assert text.returncode == 0, text.stderr
    assert "== hsx-0 (127.0.0.1) shard 0/2" in text.stdout and "== hsx-1 (127.0.0.1) shard 1/2" in text.stdout
    tokens = sum(c["total_tokens"] for c in configs)
    assert f"TOTAL: {ROWS}/{ROWS} samples (100.0%), {tokens}/{tokens} tokens" in text.stdout
    assert "ETA 0m 0s" in text.stdout


@pytest.mark.usefixtures("ansible_venv")
def test_make_status_names_a_lost_shard_as_the_slowest(fleet: Fleet, sshd: SSHServer, tmp_path: Path) -> None:
    lost = {"hsx-9": {"ansible_host": "127.0.0.1", "ansible_port": free_port(), "ansible_user": "root"}}
    inventory = fleet_inventory(tmp_path / "inventory", sshd, fleet, lost)
    done = make_status(f"INVENTORY={inventory}")
    assert done.returncode != 0 and "StatusError: could not reach hsx-9" in done.stderr
    assert "== hsx-9 (127.0.0.1) shard 2/3\n  UNREACHABLE:" in done.stdout
    assert "ETA unknown (hsx-9 stopped or without metrics" in done.stdout
    assert "slowest shard: hsx-9 (shard 2/3, unreachable, 0% settled)" in done.stdout


@pytest.mark.usefixtures("ansible_venv")
@pytest.mark.parametrize("method", ["rsync", "tar"])
def test_make_merge_gathers_over_ssh_and_merges(fleet: Fleet, sshd: SSHServer, tmp_path: Path, method: str) -> None:
    inventory = fleet_inventory(tmp_path / "inventory", sshd, fleet)
    into = tmp_path / "merged"
    args = f"MERGE_ARGS={SSH_OPTIONS} --gather-with {method}"
    done = make_status(f"INVENTORY={inventory}", f"MERGE_INTO={into}", args, target="merge")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"({'rsync' if method == 'rsync' else 'tar over ssh'})" in done.stderr
    for shard in fleet.shards:  # fetched copies, not the originals
        fetched = tmp_path / "merged.shards" / f"hsx-{shard.index}"
        assert f"shard {shard.index}/2 of hsx-{shard.index}: {fetched}" in done.stdout
        assert (fetched / "data_config.json").read_bytes() == (shard.output / "data_config.json").read_bytes()
    assert f"MERGED 2 shards into {into}: {ROWS} samples" in done.stdout
    assert verify_output(into).ok
    config = json.loads((into / "data_config.json").read_text())
    assert config["total_samples"] == sum(s.samples for s in fleet.shards) == ROWS
    assert [p["path"] for p in config["merged_from"]] == [str(tmp_path / "merged.shards" / f"hsx-{i}") for i in (0, 1)]

    # Rerun (e.g. after one more shard finished): fetched incrementally, merged again, nothing duplicated.
    again = make_status(f"INVENTORY={inventory}", f"MERGE_INTO={into}", args, target="merge")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"0 hard-linked, 0 copied, {ROWS} already in place" in again.stdout


@pytest.mark.usefixtures("ansible_venv")
def test_make_merge_on_a_shared_filesystem_takes_the_outputs_in_place(fleet: Fleet, sshd: SSHServer, tmp_path: Path) -> None:
    inventory = fleet_inventory(tmp_path / "inventory", sshd, fleet)
    into = tmp_path / "merged"
    done = make_status(f"INVENTORY={inventory}", f"MERGE_INTO={into}", "MERGE_SHARED=yes", target="merge")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "merged.shards").exists()
    config = json.loads((into / "data_config.json").read_text())
    assert [p["path"] for p in config["merged_from"]] == [str(s.output) for s in fleet.shards]
    assert config["merge_files"] == {"hard_linked": ROWS, "copied": 0}
    assert verify_output(into).ok
