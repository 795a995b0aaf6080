"""One dataset over many containers: the fleet's total, its outputs (which shard each host extracts:
:func:`~hsextract.ops.inventory.assign_shards`).

- :func:`fleet_total`: ``hsextract status``'s TOTAL over every shard's progress: samples and tokens
  settled and planned, the summed rate, the ETA of the shard that ends last (the fleet's ETA), errors,
  and the slowest shard by name.
- :func:`fetch_output`: a shard's output directory copied from its host over SSH (rsync when both ends
  have it, else a tar stream), for ``make merge`` when outputs sit on each container's local disk.
  Safe while the shard still runs: sample files are complete under their final names, temp names are
  skipped, and a manifest line whose file is not there yet is simply redone by a resume.
- :func:`fetch_regenerated`: a shard's regeneration output (the file and its journal), for ``make
  regenerate``'s merge.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hsextract.errors import ConfigError, GatherError
from hsextract.ops.inventory import Target
from hsextract.ops.status import HostStatus, duration

log = logging.getLogger(__name__)

TEMP_GLOB = ".*.tmp-*"


# -- the fleet's total ------------------------------------------------------------------------------
@dataclass
class ShardProgress:
    name: str
    shard: str  # "1/4", or "" when the host has no shard
    state: str  # running, finished, stopped, no metrics, unreachable
    settled: int = 0
    planned: int | None = 0  # None: unknown (an extractor running without metrics)
    tokens: int = 0
    tokens_planned: int = 0
    tokens_per_s: float | None = None
    eta_s: float | None = None
    errors: int = 0
    failed: int = 0

    @property
    def fraction(self) -> float:
        return self.settled / self.planned if self.planned else 0.0

    def percent(self) -> str:
        return "?" if self.planned is None else f"{self.fraction:.0%}"


@dataclass
class FleetTotal:
    shards: list[ShardProgress] = field(default_factory=list)
    settled: int = 0
    planned: int | None = 0  # None when a shard's total is unknown
    tokens: int = 0
    tokens_planned: int = 0
    tokens_per_s: float = 0.0
    errors: int = 0
    failed: int = 0
    running: int = 0
    eta_s: float | None = None  # when the last shard ends; None when a shard's end is unknown
    slowest: str | None = None  # the shard that ends last (or is furthest behind when stopped)
    unknown: list[str] = field(default_factory=list)  # shards whose progress could not be read or that stopped


def _shard_label(target: Target | None) -> str:
    if target is None or target.shard_index is None:
        return ""
    return f"{target.shard_index}/{target.num_shards}"


def shard_progress(status: HostStatus, target: Target | None) -> ShardProgress:
    line = ShardProgress(status.name, _shard_label(target), "unreachable")
    if not status.reachable:
        return line
    p = status.progress
    if p is None:
        line.state = "no metrics"
        return line
    done = p.planned is not None and p.planned > 0 and p.settled >= p.planned
    line.state = "running" if p.running else ("finished" if done else "stopped")
    line.settled, line.planned, line.tokens, line.tokens_planned = p.settled, p.planned, p.tokens, p.tokens_planned
    line.tokens_per_s = p.tokens_per_s
    line.eta_s = 0.0 if done else (p.eta_s if p.running else None)
    line.errors = sum(p.errors.values())
    line.failed = p.by_status.get("failed", 0)
    return line


def fleet_total(statuses: Sequence[HostStatus], targets: Sequence[Target]) -> FleetTotal:
    by_name = {t.name: t for t in targets}
    total = FleetTotal()
    for status in statuses:
        target = by_name.get(status.name)
        if target is not None and target.shard_index is None and target.num_shards is not None:
            continue  # a node 1.. of a multi-node server: no extractor, no shard
        line = shard_progress(status, target)
        total.shards.append(line)
        total.settled += line.settled
        total.planned = None if total.planned is None or line.planned is None else total.planned + line.planned
        total.tokens += line.tokens
        total.tokens_planned += line.tokens_planned
        if line.state == "running":
            total.tokens_per_s += line.tokens_per_s or 0.0
        total.errors += line.errors
        total.failed += line.failed
        total.running += line.state == "running"
        if line.eta_s is None:
            total.unknown.append(line.name)
    total.shards.sort(key=lambda s: (s.shard == "", int(s.shard.split("/")[0]) if s.shard else 0, s.name))
    if not total.unknown:
        total.eta_s = max((s.eta_s or 0.0 for s in total.shards), default=0.0)
    behind = [s for s in total.shards if s.state not in ("finished",)]
    if behind:
        # the shard that ends last: no known end first (stopped, unreadable), then the longest ETA, then least done
        slowest = max(behind, key=lambda s: (s.eta_s is None, s.eta_s or 0.0, -s.fraction))
        total.slowest = slowest.name
    return total


def _count(planned: int | None) -> str:
    return "?" if planned is None else str(planned)


def render_total(total: FleetTotal) -> str:
    shards = len(total.shards)
    pct = "?" if total.planned is None else f"{total.settled / total.planned:.1%}" if total.planned else "-"
    lines = [f"== TOTAL ({shards} shard{'s' if shards != 1 else ''}, {total.running} running)"]
    for s in total.shards:
        eta = "-" if s.eta_s is None else duration(s.eta_s)
        rate = f"{s.tokens_per_s:.0f} tok/s" if s.tokens_per_s and s.state == "running" else "-"
        lines.append(
            f"  {s.name:<16} shard {s.shard or '-':<6} {s.state:<11} {s.settled}/{_count(s.planned)} samples "
            f"({s.percent()}), {s.tokens} tokens, {rate}, ETA {eta}, errors {s.errors}"
        )
    eta = (
        duration(total.eta_s)
        if total.eta_s is not None
        else f"unknown ({', '.join(total.unknown)} stopped or without metrics: docs/runbooks/shard-behind.md)"
    )
    lines.append(
        f"  TOTAL: {total.settled}/{_count(total.planned)} samples ({pct}), {total.tokens}/{total.tokens_planned} tokens, "
        f"{total.tokens_per_s:.0f} tokens/s, ETA {eta}, errors {total.errors} (failed samples {total.failed})"
    )
    if total.slowest is not None:
        slow = next(s for s in total.shards if s.name == total.slowest)
        lines.append(f"  slowest shard: {slow.name} (shard {slow.shard or '-'}, {slow.state}, {slow.percent()} settled)")
    return "\n".join(lines)


# -- gathering outputs ------------------------------------------------------------------------------
def _ssh_argv(target: Target, options: Sequence[str]) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes"]
    for option in options:
        argv += ["-o", option]
    if target.port:
        argv += ["-p", str(target.port)]
    if target.key_filename:
        argv += ["-i", target.key_filename]
    argv.append(f"{target.user}@{target.host}" if target.user else str(target.host))
    return argv


GATHER_METHODS = ("auto", "rsync", "tar")


def _tar_over_ssh(target: Target, ssh: list[str], remote: str, dest: Path, what: str) -> None:
    """Run ``remote`` (a command that writes a tar stream) on the host and unpack its stream into ``dest``;
    GatherError naming ``what`` when either end fails."""
    with subprocess.Popen([*ssh, remote], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sender:
        done = subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=sender.stdout, capture_output=True, text=True)
        _, sender_err = sender.communicate()
    if sender.returncode != 0:
        raise GatherError(f"{target.name}: copying {what} over ssh failed ({sender.returncode}): "
                          f"{sender_err.decode().strip()[-300:]}")
    if done.returncode != 0:
        raise GatherError(f"{target.name}: unpacking {what} failed ({done.returncode}): {done.stderr.strip()[-300:]}")


def fetch_output(target: Target, dest: Path, ssh_options: Sequence[str] = (), method: str = "auto") -> str:
    """Copy ``target.output_dir`` from its host into ``dest`` (created); returns the method used.

    ``auto``: rsync when both ends have it, else a tar stream over ssh."""
    if method not in GATHER_METHODS:
        raise ConfigError(f"gather method {method!r} is not one of {', '.join(GATHER_METHODS)}")
    if target.host is None:
        raise GatherError(f"{target.name} is this machine: pass its output directory to hsextract merge directly")
    dest.mkdir(parents=True, exist_ok=True)
    ssh = _ssh_argv(target, ssh_options)
    source = target.output_dir.rstrip("/")
    probe = subprocess.run(
        [*ssh, f"test -f {shlex.quote(source + '/data_config.json')} || test -f {shlex.quote(source + '/samples.jsonl')}; "
         "echo rc=$?; command -v rsync || true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        raise GatherError(
            f"{target.name}: ssh {target.host} failed ({probe.returncode}): {probe.stderr.strip()[-300:]}; check the "
            "inventory's address, port and key"
        )
    if "rc=0" not in probe.stdout:
        raise GatherError(f"{target.name}: {source} holds no hsextract output; check hsx_output_dir of that host")
    both_have_rsync = bool(shutil.which("rsync")) and "rsync" in probe.stdout.split("rc=", 1)[1]
    if method == "rsync" and not both_have_rsync:
        raise GatherError(f"{target.name}: rsync is missing here or on {target.host}; install it or use --gather-with tar")
    if method == "rsync" or (method == "auto" and both_have_rsync):
        command = [
            "rsync", "-a", "--delete", "--exclude", TEMP_GLOB, "-e", shlex.join(ssh[:-1]),
            f"{ssh[-1]}:{source}/", f"{dest}/",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise GatherError(f"{target.name}: copying {source} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        method = "rsync"
    else:
        remote = f"tar -C {shlex.quote(source)} --exclude={shlex.quote(TEMP_GLOB)} -cf - ."
        _tar_over_ssh(target, ssh, remote, dest, source)
        method = "tar over ssh"
    log.info("%s: %s:%s -> %s (%s)", target.name, target.host, source, dest, method)
    return method


def fetch_regenerated(target: Target, dest: Path, ssh_options: Sequence[str] = ()) -> Path:
    """Copy the regeneration output ``target.regen_output`` and its journal from the host into ``dest``
    (a tar stream over ssh: text files, copied whole); returns the local path of the output file."""
    if not target.regen_output:
        raise ConfigError(f"{target.name}: hsx_regen_output is not set in the inventory; set it to the file "
                          "playbooks/regenerate.yml writes (inventory/example: group_vars/all.yml)")
    if target.host is None:
        return Path(target.regen_output)
    source = Path(target.regen_output)
    names = [source.name, source.name + ".journal"]
    dest.mkdir(parents=True, exist_ok=True)
    remote = (f"test -f {shlex.quote(str(source.with_name(names[1])) + '/summary.json')} || "
              f"{{ echo 'no complete regeneration at {source}' >&2; exit 3; }}; "
              f"tar -C {shlex.quote(str(source.parent))} --exclude={shlex.quote(TEMP_GLOB)} -cf - "
              + " ".join(shlex.quote(n) for n in names))
    try:
        _tar_over_ssh(target, _ssh_argv(target, ssh_options), remote, dest, str(source))
    except GatherError as exc:
        raise GatherError(f"{exc}; run make regenerate (playbooks/regenerate.yml) to its end") from None
    log.info("%s: %s:%s -> %s (tar over ssh)", target.name, target.host, source, dest)
    return dest / source.name


def shard_dirs_from_inventory(
    targets: Sequence[Target], gather_into: Path | None, ssh_options: Sequence[str] = (), method: str = "auto"
) -> list[Path]:
    """Each shard's output: fetched under ``gather_into/<host>`` over SSH, or (None) its path as is (shared FS)."""
    dirs = []
    for target in sorted(targets, key=lambda t: (t.shard_index or 0, t.name)):
        if gather_into is None:
            dirs.append(Path(target.output_dir))
            continue
        dest = gather_into / target.name
        fetch_output(target, dest, ssh_options, method)
        dirs.append(dest)
    return dirs


def to_json(statuses: Sequence[HostStatus], targets: Sequence[Target], total: FleetTotal) -> str:
    """``hsextract status --json``: every host (with its shard) and the total."""
    by_name = {t.name: t for t in targets}
    hosts = []
    for status in statuses:
        target = by_name.get(status.name)
        entry = asdict(status)
        entry["shard_index"] = None if target is None else target.shard_index
        entry["num_shards"] = None if target is None else target.num_shards
        hosts.append(entry)
    return json.dumps({"hosts": hosts, "total": asdict(total)}, indent=2)
