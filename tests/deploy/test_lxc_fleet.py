"""A fleet of two real LXC containers (embedded runtime): deploy.yml over both, one shard each, `make extract`
with one container's extraction SIGKILLed mid-run and resumed, `make status` showing both shards and the
TOTAL, `make merge` gathering both outputs over SSH and merging them into one output that verifies.

Containers hsx-fleet-a (10.197.91.2) and hsx-fleet-b (10.197.92.2) from scripts/lxc/testbed.sh, removed in
the finalizer also when a test fails. The tests run in file order and share the deployment.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .helpers import REPO, TEST_SETTINGS, TESTBED, Container, _require_host, run_make, run_playbook

FLEET = {"fleet-a": ("hsx-fleet-a", "10.197.91"), "fleet-b": ("hsx-fleet-b", "10.197.92")}
ROWS = 400  # 200 a shard: long enough to kill one extraction mid-run
OUTPUT = TEST_SETTINGS["hsx_output_dir"]
REGEN_ROWS = 9  # 5 + 4: shards of different sizes
SSH_OPTIONS = "--ssh-option StrictHostKeyChecking=no --ssh-option UserKnownHostsFile=/dev/null"


@pytest.fixture(scope="module")
def containers(request: pytest.FixtureRequest) -> dict[str, Container]:
    _require_host()
    started: dict[str, Container] = {}
    for vmid, (host, (name, net)) in enumerate(FLEET.items(), start=191):
        env = {**os.environ, "HSX_LXC_NAME": name, "HSX_LXC_NET": net, "HSX_LXC_DIR": f"/var/tmp/{name}"}
        env["HSX_LXC_VMID"] = str(vmid)
        env.setdefault("HSX_HOST_PIP", str(REPO / ".venv" / "bin" / "pip"))
        request.addfinalizer(functools.partial(subprocess.run, [str(TESTBED), "down"], env=env, check=False))
        proc = subprocess.run([str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=900)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            pytest.fail(f"testbed.sh up {name} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
        info = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        started[host] = Container(
            info["HSX_LXC_NAME"], info["HSX_LXC_IP"], info["HSX_LXC_KEY"], info["HSX_LXC_WHEELHOUSE"],
            int(info["HSX_LXC_VMID"]), info["HSX_LXC_PCT"], Path(info["HSX_LXC_PCT_LOG"]),
        )  # fmt: skip
    return started


@pytest.fixture(scope="module")
def inventory(containers: dict[str, Container], tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("fleet")
    root = work / "inventory"  # the source snapshot beside it, not inside (ansible-inventory reads every file there)
    root.mkdir()
    example = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    shutil.copytree(REPO / "extractor", work / "extractor", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "constraints.txt", work / "constraints.txt")
    settings = {
        **example,
        **TEST_SETTINGS,
        "hsx_extractor_sample_rows": ROWS,  # the same file in both containers (fixed seed)
        "hsx_proxmox_manage": False,  # the Proxmox side is test_lxc_deploy.py's; here: the fleet
        "hsx_container_env_pip_args": ["--no-index", "--find-links", "/srv/wheelhouse"],
        "hsx_container_env_hsextract_src": str(work / "extractor"),
        "hsx_container_env_constraints": str(work / "constraints.txt"),
        # make regenerate: the same sample conversations in both containers (fixed seed), a few short answers
        "hsx_regen_dataset": "/opt/hsextract/conversations.jsonl",
        "hsx_regenerator_make_sample_data": True,
        "hsx_regenerator_sample_rows": REGEN_ROWS,
        "hsx_regenerator_max_new_tokens": 6,
        "hsx_regenerator_concurrency": 4,
    }
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    hosts = {
        name: {
            "ansible_host": c.ip,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": c.key,
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "hsx_proxmox_host": "none",
            "hsx_vmid": c.vmid,
        }
        for name, c in containers.items()
    }
    groups = {"proxmox_hosts": {"hosts": {}}, "extraction_containers": {"hosts": hosts}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=False))
    return root


def make(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    command = ["make", "-s", "--no-print-directory", "-C", str(REPO), "-o", ".venv/.setup-done", "HSX_INVENTORY_CONFIGURED="]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)
    print(f"$ make {' '.join(args)} (rc {done.returncode})\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def lines(container: Container, path: str) -> int:
    return int(container.run(f"cat {path} 2>/dev/null | wc -l", check=False).stdout.strip() or 0)


@pytest.fixture(scope="module")
def deployed(containers: dict[str, Container], inventory: Path) -> None:
    started = time.monotonic()
    result = run_playbook("deploy.yml", inventory)
    assert result.rc == 0, "deploy.yml failed:\n" + result.output[-8000:]
    recap = result.recap()
    assert {h: recap[h]["failed"] for h in FLEET} == {"fleet-a": 0, "fleet-b": 0}, recap
    print(f"deploy.yml over two containers: {time.monotonic() - started:.0f} s")


def test_each_container_gets_its_own_shard(deployed: None, containers: dict[str, Container]) -> None:
    for index, host in enumerate(sorted(FLEET)):
        config = yaml.safe_load(containers[host].run("cat /etc/hsextract/extract.yaml").stdout)
        assert (config["shard_index"], config["num_shards"]) == (index, 2), host


def test_extract_with_one_container_killed_and_resumed_then_status_and_merge(
    deployed: None, containers: dict[str, Container], inventory: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    result = run_playbook("playbooks/extract.yml", inventory)  # starts both jobs, does not wait
    assert result.rc == 0, result.output[-8000:]
    b = containers["fleet-b"]
    deadline = time.monotonic() + 300
    while lines(b, f"{OUTPUT}/samples.jsonl") < 10:
        assert time.monotonic() < deadline, "fleet-b wrote no samples"
        time.sleep(0.2)

    # the container's extraction dies (SIGKILL) mid-run, at once: make status's two SSH rounds took long
    # enough for a whole shard to finish first; rerunning make extract resumes it
    b.run("systemctl kill -s SIGKILL hsextract-extract.service", check=False)
    partial = lines(b, f"{OUTPUT}/samples.jsonl")
    assert partial < ROWS // 2, f"the kill came too late to test anything ({partial} samples)"

    # make status with one shard killed (the other running or done): both shards and the TOTAL
    status = make("status", f"INVENTORY={inventory}", "STATUS_ARGS=--json", timeout=180)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [(h["name"], h["shard_index"], h["num_shards"]) for h in report["hosts"]] == [("fleet-a", 0, 2), ("fleet-b", 1, 2)]
    assert all(h["reachable"] for h in report["hosts"])
    with_progress = [h for h in report["hosts"] if h["progress"]]
    assert report["total"]["planned"] == sum(h["progress"]["planned"] for h in with_progress)
    text = make("status", f"INVENTORY={inventory}", timeout=180)
    assert "== fleet-a (10.197.91.2) shard 0/2" in text.stdout and "== fleet-b (10.197.92.2) shard 1/2" in text.stdout
    assert "TOTAL: " in text.stdout

    result = run_playbook("playbooks/extract.yml", inventory, "-e", "hsx_extract_wait=true")
    assert result.rc == 0, result.output[-8000:]
    print(f"make extract over two containers, one killed and resumed: {time.monotonic() - started:.0f} s")
    # the resumed run kept what the killed one had written and did only the rest
    summary = b.run("journalctl -u hsextract-extract.service -o cat | grep 'written now' | tail -n 1").stdout
    match = re.search(r"written now (\d+), already done (\d+)", summary)
    assert match, summary
    written_now, already_done = int(match.group(1)), int(match.group(2))
    assert already_done >= partial - 1 and written_now + already_done == ROWS // 2, summary
    configs = {h: json.loads(c.run(f"cat {OUTPUT}/data_config.json").stdout) for h, c in containers.items()}
    assert all(c["status"] == "complete" for c in configs.values())
    assert sum(c["rows_in_shard"] for c in configs.values()) == ROWS

    # make merge: both outputs gathered over SSH, merged, verified
    into = tmp_path / "merged"
    merged = make("merge", f"INVENTORY={inventory}", f"MERGE_INTO={into}", f"MERGE_ARGS={SSH_OPTIONS}")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert f"MERGED 2 shards into {into}" in merged.stdout and ": OK" in merged.stdout
    config = json.loads((into / "data_config.json").read_text())
    assert config["total_samples"] == sum(c["total_samples"] for c in configs.values())
    assert config["total_samples"] + config["bad_input_samples"] == ROWS
    assert [p["shard_index"] for p in config["merged_from"]] == [0, 1]
    verify = subprocess.run([str(REPO / ".venv/bin/hsextract"), "verify", str(into)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_lost_containers_shard_is_finished_on_the_other_one(
    deployed: None, containers: dict[str, Container], inventory: Path, tmp_path: Path
) -> None:
    """fleet-b is lost for good; what it wrote (as last gathered: all but its last 30 rows) goes to fleet-a,
    whose own shard is done, and `make takeover` finishes shard 1 there without redoing a row."""
    a, b = containers["fleet-a"], containers["fleet-b"]
    taken = "/var/lib/hsextract/takeover-1"
    send = shlex.join(b.ssh_argv(f"tar -C {OUTPUT} -cf - ."))
    receive = shlex.join(a.ssh_argv(f"mkdir -p {taken} && tar -C {taken} -xf -"))
    subprocess.run(f"{send} | {receive}", shell=True, check=True, timeout=120)
    drop = (
        "import json, os; d = '" + taken + "'; lines = open(d + '/samples.jsonl').read().splitlines(); "
        "[os.unlink(os.path.join(d, json.loads(l)['file'])) for l in lines[-30:]]; "
        "open(d + '/samples.jsonl', 'w').write(''.join(l + '\\n' for l in lines[:-30])); "
        "os.unlink(d + '/data_config.json')"
    )
    a.run(f"python3 -c {shlex.quote(drop)}")
    started = time.monotonic()
    done = make(
        "takeover", f"INVENTORY={inventory}", "TAKEOVER_HOST=fleet-a", "TAKEOVER_SHARD=1", f"TAKEOVER_OUTPUT={taken}",
        "HSX_EXTRACT_WAIT=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    print(f"make takeover of 30 rows: {time.monotonic() - started:.0f} s")
    summary = a.run("journalctl -u hsextract-takeover-1.service -o cat | grep 'written now' | tail -n 1").stdout
    assert f"written now 30, already done {ROWS // 2 - 30}" in summary, summary
    config = json.loads(a.run(f"cat {taken}/data_config.json").stdout)
    assert (config["shard_index"], config["num_shards"], config["status"]) == (1, 2, "complete")

    # fleet-a's own shard and the taken-over one merge into the whole dataset
    local = {}
    for name, source in (("shard0", OUTPUT), ("shard1", taken)):
        local[name] = tmp_path / name
        local[name].mkdir()
        fetch = shlex.join(a.ssh_argv(f"tar -C {source} -cf - ."))
        subprocess.run(f"{fetch} | tar -C {local[name]} -xf -", shell=True, check=True, timeout=120)
    into = tmp_path / "merged"
    hsextract = str(REPO / ".venv/bin/hsextract")
    merged = subprocess.run([hsextract, "merge", str(local["shard0"]), str(local["shard1"]), "--into", str(into)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert json.loads((into / "data_config.json").read_text())["total_samples"] == ROWS


def test_make_regenerate_gives_each_container_its_shard_and_merges_them_in_input_order(
    deployed: None, containers: dict[str, Container], inventory: Path, tmp_path: Path
) -> None:
    """make regenerate: playbooks/regenerate.yml over both containers (each regenerates its shard with its own
    embedded server, followed to its end), then the shards gathered over SSH and joined in input order."""
    into = tmp_path / "regenerated.jsonl"
    started = time.monotonic()
    done = run_make("regenerate", inventory, "-o", ".venv/.setup-done", f"REGEN_INTO={into}",
                    f"REGEN_MERGE_ARGS={SSH_OPTIONS}")  # fmt: skip
    assert done.rc == 0, done.output[-8000:]
    print(f"make regenerate over two containers: {time.monotonic() - started:.0f} s")
    assert f"MERGED 2 regeneration shard(s) into {into}: input rows {REGEN_ROWS}: ok {REGEN_ROWS}" in done.output
    for index, host in enumerate(sorted(FLEET)):
        config = yaml.safe_load(containers[host].run("cat /etc/hsextract/regenerate.yaml").stdout)
        assert (config["shard_index"], config["num_shards"]) == (index, 2), host
    given = [json.loads(line) for line in containers["fleet-a"].run("cat /opt/hsextract/conversations.jsonl").stdout.splitlines()]
    merged = [json.loads(line) for line in into.read_text().splitlines()]
    assert [row["id"] for row in merged] == [row["id"] for row in given]
    assert [row["regen"]["source_row"] for row in merged] == list(range(REGEN_ROWS))
    for row, source in zip(merged, given, strict=True):
        assert len(row["conversations"]) == len(source["conversations"])
        assert all(t["finish_reason"] in ("stop", "length") and t["generated_tokens"] <= 6 for t in row["regen"]["turns"])
    summary = json.loads(into.with_name(into.name + ".journal").joinpath("summary.json").read_text())
    assert [m["shard_index"] for m in summary["merged_from"]] == [0, 1]
    assert [m["counts"]["rows_in"] for m in summary["merged_from"]] == [5, 4]
    # a rerun: both shards are complete (nothing regenerated again), the merge writes the same file
    before = into.read_bytes()
    again = run_make("regenerate", inventory, "-o", ".venv/.setup-done", f"REGEN_INTO={into}",
                     f"REGEN_MERGE_ARGS={SSH_OPTIONS}")  # fmt: skip
    assert again.rc == 0, again.output[-8000:]
    assert again.output.count("ALREADY COMPLETE") == 2, again.output[-4000:]
    assert into.read_bytes() == before
