"""The extraction hosts as the Ansible inventory describes them: :class:`Target`, the inventory readers
(``ansible-inventory --list``, group ``extraction_containers``) and the shard each host extracts
(:func:`assign_shards`, the rule ``playbooks/vars/deploy.yml`` renders; ``tests/deploy/test_shards.py``
checks that both agree). ``hsextract status`` (``status.py``) and the fleet's total and outputs
(``fleet.py``) read hosts from here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.contract import defaults
from hsextract.errors import ConfigError

GROUP = "extraction_containers"


@dataclass(frozen=True)
class Target:
    """One host to look at; ``host`` None means this machine."""

    name: str
    host: str | None = None
    user: str | None = None
    port: int | None = None
    key_filename: str | None = None
    become: bool = False
    server_port: int = defaults.SERVER_PORT
    metrics_port: int = defaults.METRICS_PORT
    output_dir: str = "work/output"
    dump_dir: str = "/dev/shm/hsextract-default"
    shard_index: int | None = None  # the slice this host extracts (inventory: assign_shards)
    num_shards: int | None = None
    regen_output: str | None = None  # the file hsextract regenerate writes there (hsx_regen_output)
    log_file: str | None = None  # this machine's log to show instead of the units' journals (make logs: WORK/server.log)


def assign_shards(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, int], int]:
    """Each host's shard index, and the number of shards: a host's ``hsx_shard_index`` when set; the other
    hosts, in sorted order, take the indices left free, lowest first (so without any setting: the host's
    position in the sorted group). ``num_shards`` is ``hsx_num_shards`` when set, else the group's size.
    Indices must be unique and below ``num_shards``. Nodes 1.. of a multi-node server (``hsx_node_rank``
    above 0) extract nothing and get no shard."""
    ordered = sorted(h for h in hosts if int(hostvars.get(h, {}).get("hsx_node_rank") or 0) == 0)
    explicit_num = [hostvars.get(h, {}).get("hsx_num_shards") for h in ordered]
    given = {int(n) for n in explicit_num if n not in (None, "")}
    if len(given) > 1:
        raise ConfigError(f"hsx_num_shards differs between hosts ({sorted(given)}); set it once, in group_vars")
    num_shards = given.pop() if given else len(ordered)
    shards: dict[str, int] = {}
    for host in ordered:
        value = hostvars.get(host, {}).get("hsx_shard_index")
        if value not in (None, ""):
            shards[host] = int(value)
    free = iter(i for i in range(max(num_shards, len(ordered))) if i not in shards.values())
    for host in ordered:
        if host not in shards:
            shards[host] = next(free)
    seen: dict[int, str] = {}
    for host in ordered:
        index = shards[host]
        if not 0 <= index < num_shards:
            raise ConfigError(
                f"{host}: shard index {index} is outside 0..{num_shards - 1}; fix hsx_shard_index or set hsx_num_shards"
            )
        if index in seen:
            raise ConfigError(
                f"{seen[index]} and {host} both extract shard {index}: give each host its own hsx_shard_index "
                "(or drop them all to use the hosts' sorted order)"
            )
        seen[index] = host
    return shards, num_shards


def find_ansible_inventory() -> str:
    """``ansible-inventory`` next to this interpreter, in the repo's .venv-ansible, or on PATH."""
    candidates = [Path(sys.executable).parent / "ansible-inventory", Path.cwd() / ".venv-ansible/bin/ansible-inventory"]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("ansible-inventory")
    if found is None:
        raise ConfigError(
            "ansible-inventory not found (next to python, in .venv-ansible/bin or on PATH); install ansible-core "
            "(scripts/lxc/setup-ansible-venv.sh) or pass --ansible-inventory PATH"
        )
    return found


def targets_from_inventory_json(data: dict[str, Any], group: str = GROUP) -> list[Target]:
    hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})

    def hosts_of(name: str, seen: set[str]) -> list[str]:
        if name in seen:
            return []
        seen.add(name)
        entry = data.get(name, {})
        hosts = list(entry.get("hosts", []))
        for child in entry.get("children", []):
            hosts += [h for h in hosts_of(child, seen) if h not in hosts]
        return hosts

    if group not in data:
        raise ConfigError(f"the inventory has no group {group!r}; put the extraction containers in it")
    hosts = hosts_of(group, set())
    shards, num_shards = assign_shards(hosts, hostvars)
    targets = []
    for name in hosts:
        hv = hostvars.get(name, {})
        key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
        targets.append(
            Target(
                name=name,
                host=str(hv.get("ansible_host", name)),
                user=hv.get("ansible_user"),
                port=int(hv["ansible_port"]) if hv.get("ansible_port") else None,
                key_filename=str(Path(key).expanduser()) if key else None,
                become=bool(hv.get("ansible_become", False)),
                server_port=int(hv.get("hsx_server_port", defaults.SERVER_PORT)),
                metrics_port=int(hv.get("hsx_metrics_port", defaults.METRICS_PORT)),
                output_dir=str(hv.get("hsx_output_dir", "/")),
                dump_dir=str(hv.get("hsx_dump_dir", "/dev/shm")),
                shard_index=shards.get(name),
                num_shards=num_shards,
                regen_output=str(hv["hsx_regen_output"]) if hv.get("hsx_regen_output") else None,
            )
        )
    if not targets:
        raise ConfigError(f"group {group!r} of the inventory has no hosts; add the extraction containers to it")
    return targets


def load_inventory(inventory: Path, ansible_inventory: str | None = None) -> list[Target]:
    """Hosts of group extraction_containers, as ``ansible-inventory -i INVENTORY --list`` resolves them."""
    if not inventory.exists():
        raise ConfigError(f"inventory {inventory} does not exist; pass --inventory DIR (e.g. a copy of inventory/example)")
    command = [ansible_inventory or find_ansible_inventory(), "-i", str(inventory), "--list"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return targets_from_inventory_json(json.loads(done.stdout))
