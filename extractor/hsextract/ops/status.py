"""``hsextract status`` (``make status``, ``make logs``): what the runbooks ask to look at, in seconds.

For each extraction host it gathers, with read-only commands only: the server's health (HTTP status of
``/health_generate``), the state of the ``hsextract-server`` and ``hsextract-extract`` units (and their
last log lines with ``--logs N``), ``/dev/shm`` and output disk use (``df -B1``), and the extraction's
progress and ETA from the extractor's own ``/metrics``; for an extractor started without
``--metrics-port``, its pid from the output's ``extract.lock`` (held: ``/proc/locks``) and the samples
written so far; when the extractor is not running (finished, stopped, killed), the counts and the status
(complete, interrupted, stopped...) its output's ``data_config.json`` records; an output directory that
is not there is said. Hosts come from an Ansible inventory (group
``extraction_containers``, through ``ansible-inventory --list``) and are reached over SSH with fabric,
one connection per host, all hosts at once; with no inventory it looks at this machine.

Per-host settings are the inventory's (``hsx_server_port``, ``hsx_metrics_port``, ``hsx_output_dir``,
``hsx_dump_dir``); the defaults match the embedded default run (``make extract``).
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from hsextract.contract import defaults
from hsextract.extract.data_config import DATA_CONFIG_FILE
from hsextract.extract.lock import LOCK_FILE
from hsextract.extract.manifest import SAMPLES_FILE
from hsextract.ops.inventory import Target, load_inventory

log = logging.getLogger(__name__)

UNITS = ("hsextract-server", "hsextract-extract")
COMMAND_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one shell command on a target; never raises for a non-zero exit."""

    def run(self, command: str) -> CommandResult: ...

    def close(self) -> None: ...


class LocalRunner:
    """This machine, through bash."""

    def run(self, command: str) -> CommandResult:
        try:
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"timed out after {COMMAND_TIMEOUT_S:.0f} s")
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def close(self) -> None:
        pass


class SSHRunner:
    """One fabric connection to a host, reused for every command."""

    def __init__(self, target: Target, connect_timeout_s: float = 10.0) -> None:
        from fabric import Connection  # type: ignore[import-untyped]

        connect_kwargs: dict[str, Any] = {}
        if target.key_filename:
            connect_kwargs["key_filename"] = [target.key_filename]
        self.target = target
        self._connection = Connection(
            target.host, user=target.user, port=target.port, connect_timeout=connect_timeout_s, connect_kwargs=connect_kwargs
        )
        self._connection.open()

    def run(self, command: str) -> CommandResult:
        result = self._connection.run(
            f"bash -c {shlex.quote(command)}", hide=True, warn=True, in_stream=False, timeout=COMMAND_TIMEOUT_S
        )
        return CommandResult(int(result.exited), str(result.stdout), str(result.stderr))

    def close(self) -> None:
        self._connection.close()


# -- what is gathered -----------------------------------------------------------------------------
@dataclass
class Filesystem:
    path: str  # as asked
    mount: str
    size_bytes: int
    used_bytes: int
    available_bytes: int

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.size_bytes if self.size_bytes else 0.0


@dataclass
class Progress:
    running: bool
    server_up: bool | None
    planned: int
    settled: int
    by_status: dict[str, int]
    tokens: int
    tokens_planned: int
    errors: dict[str, int]
    inflight: int
    elapsed_s: float | None = None  # age of the extractor process
    tokens_per_s: float | None = None
    eta_s: float | None = None
    outcome: str | None = None  # the status data_config.json records (complete, interrupted...) when read from it


@dataclass
class LockHolder:
    """The extractor holding the output's extract.lock, as its file records it."""

    pid: int
    host: str
    since: str
    written: int  # lines in samples.jsonl so far


@dataclass
class HostStatus:
    name: str
    address: str
    reachable: bool = True
    error: str | None = None
    health: int | None = None  # HTTP status of /health_generate; None: no answer
    units: dict[str, str] = field(default_factory=dict)
    filesystems: list[Filesystem] = field(default_factory=list)
    progress: Progress | None = None
    metrics_error: str | None = None
    logs: dict[str, str] = field(default_factory=dict)
    lock_holder: LockHolder | None = None  # an extractor holds the output (with or without metrics)
    output_missing: str | None = None  # why no output was read: its directory is not there


_CURL = {"code": "curl -s -m 30 -o /dev/null -w '%{{http_code}}' {url}", "body": "curl -sf -m 10 {url}"}
_PYTHON = {"code": "r.status", "body": "r.read().decode()"}


def _http_get(url: str, what: str) -> str:
    """Shell printing the status code (what=code) or the body (what=body) of a GET, with curl or else python3."""
    fallback = "'000'" if what == "code" else "''"
    py = (
        "import urllib.request as u\n"
        f"try:\n r=u.urlopen({url!r},timeout=30)\n print({_PYTHON[what]},end='')\n"
        f"except Exception as e:\n print(getattr(e,'code',{fallback}) if {what == 'code'} else '',end='')"
    )
    return f"if command -v curl >/dev/null; then {_CURL[what].format(url=url)}; else python3 -c {shlex.quote(py)}; fi"


def status_commands(target: Target, log_lines: int) -> dict[str, str]:
    """The read-only shell commands run on a target, by purpose."""
    units = " ".join(UNITS)
    sudo = "sudo -n " if target.become else ""
    commands = {
        "health": _http_get(f"http://127.0.0.1:{target.server_port}/health_generate", "code"),
        "units": f"command -v systemctl >/dev/null && systemctl is-active {units}",
        "df": "df -B1 --output=file,target,size,used,avail /dev/shm "
        f"{shlex.quote(target.dump_dir)} {shlex.quote(target.output_dir)}",
        "metrics": _http_get(f"http://127.0.0.1:{target.metrics_port}/metrics", "body"),
        "data_config": f"cat {shlex.quote(target.output_dir + '/' + DATA_CONFIG_FILE)} 2>/dev/null",
        "output": f"test -d {shlex.quote(target.output_dir)} && echo present",
        "lock": _lock_holder_command(target.output_dir),
        "elapsed": (
            f"pid=$(fuser -n tcp {target.metrics_port} 2>/dev/null | awk '{{print $1}}'); "
            '[ -n "$pid" ] && ps -o etimes= -p "$pid"'
        ),
    }
    if log_lines > 0:
        for unit in UNITS:
            commands[f"log:{unit}"] = f"{sudo}journalctl -u {unit} -n {int(log_lines)} --no-pager -o short-iso"
    return commands


def _lock_holder_command(output_dir: str) -> str:
    """Shell printing the output's extract.lock record, then ``holder PID`` for each process that holds its
    flock (``/proc/locks``, by inode: a lock file a killed extractor left names a dead pid and has no
    holder) and ``written N``, the lines of samples.jsonl so far."""
    lock = shlex.quote(f"{output_dir}/{LOCK_FILE}")
    samples = shlex.quote(f"{output_dir}/{SAMPLES_FILE}")
    # /proc/locks: "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF" (a waiter's line has "->" in $2)
    by_inode = '$2 == "FLOCK" { n = split($6, a, ":"); if (a[n] == ino) print "holder", $5 }'
    return (
        f"[ -f {lock} ] && head -c 4096 {lock} && echo && "
        f"awk -v ino=\"$(stat -c %i {lock})\" {shlex.quote(by_inode)} /proc/locks && "
        f"echo written $(cat {samples} 2>/dev/null | wc -l)"
    )


def parse_lock_holder(stdout: str) -> LockHolder | None:
    """The holder of the output's extract.lock from :func:`_lock_holder_command`'s lines; None when nothing holds it."""
    lines = stdout.splitlines()
    holders = [line.split()[1] for line in lines if line.startswith("holder ") and line.split()[1].isdigit()]
    if not lines or not holders:
        return None
    try:
        record = json.loads(lines[0])
    except ValueError:
        record = {}
    record = record if isinstance(record, dict) else {}
    written = next((line.split()[1] for line in lines if line.startswith("written ")), "0")
    recorded = str(record.get("pid"))
    pid = recorded if recorded in holders else holders[0]  # the file's pid, when it is the holder's
    return LockHolder(int(pid), str(record.get("host", "?")), str(record.get("since", "?")),
                      int(written) if written.isdigit() else 0)  # fmt: skip


def _missing_output(target: Target) -> str:
    where = "give --output-dir (the extract's --output)" if target.host is None else "check hsx_output_dir"
    relative = "" if target.host is not None or Path(target.output_dir).is_absolute() else f" (under {Path.cwd()})"
    return f"output {target.output_dir}{relative}: no such directory on this host; {where}"


def parse_units(stdout: str) -> dict[str, str]:
    states = [line.strip() for line in stdout.splitlines() if line.strip()]
    if len(states) != len(UNITS):
        return {unit: "unknown (no systemd)" for unit in UNITS}
    return dict(zip(UNITS, states, strict=True))


def parse_df(stdout: str) -> list[Filesystem]:
    """``df --output=file,target,size,used,avail`` lines, one per mount (the dump dir may be on /dev/shm)."""
    seen: dict[str, Filesystem] = {}
    for line in stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) != 5 or not all(p.isdigit() for p in parts[2:]):
            continue
        path, mount = parts[0], parts[1]
        seen.setdefault(mount, Filesystem(path, mount, int(parts[2]), int(parts[3]), int(parts[4])))
    return list(seen.values())


def parse_metrics(text: str, elapsed_s: float | None = None) -> Progress:
    """Progress from one scrape of the extractor's /metrics; the ETA averages since the process started."""
    values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value

    def one(name: str) -> float:
        return sum(values.get(name, {}).values())

    def by(name: str, label: str) -> dict[str, int]:
        return {dict(k).get(label, ""): int(v) for k, v in values.get(name, {}).items()}

    if "hsextract_samples_planned" not in values:
        raise ValueError("no hsextract_samples_planned in the scrape: is this the extractor's /metrics?")
    by_status = by("hsextract_samples_total", "status")
    progress = Progress(
        running=one("hsextract_running") == 1,
        server_up=None if "hsextract_server_up" not in values else one("hsextract_server_up") == 1,
        planned=int(one("hsextract_samples_planned")),
        settled=sum(by_status.values()),
        by_status=by_status,
        tokens=int(one("hsextract_tokens_total")),
        tokens_planned=int(one("hsextract_tokens_planned")),
        errors={reason: n for reason, n in by("hsextract_errors_total", "reason").items() if n},  # every reason has a series
        inflight=int(one("hsextract_inflight_requests")),
        elapsed_s=elapsed_s,
    )
    if elapsed_s and elapsed_s > 0 and progress.tokens > 0:
        progress.tokens_per_s = progress.tokens / elapsed_s
        progress.eta_s = max(0, progress.tokens_planned - progress.tokens) / progress.tokens_per_s
    return progress


def parse_data_config(text: str) -> Progress | None:
    """The final counts an output's data_config.json records (what a finished run leaves); None if unreadable."""
    try:
        config = json.loads(text)
        written, bad, failed = (int(config[k]) for k in ("total_samples", "bad_input_samples", "failed_samples"))
        planned, tokens = int(config["rows_in_shard"]), int(config["total_tokens"])
        outcome, errors = str(config["status"]), {str(k): int(v) for k, v in (config.get("error_counts") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    by_status = {"ok": written, "bad_input": bad, "failed": failed}
    done = outcome == "complete"
    return Progress(False, None, planned, written + bad + failed, by_status, tokens, tokens, errors, 0, None, None,
                    0.0 if done else None, outcome)  # fmt: skip


def gather(target: Target, runner: Runner, log_lines: int = 0) -> HostStatus:
    """Run the read-only commands on one target through ``runner`` and parse what they print."""
    status = HostStatus(target.name, target.host or "this machine")
    results = {purpose: runner.run(command) for purpose, command in status_commands(target, log_lines).items()}
    code = results["health"].stdout.strip()
    status.health = int(code) if code.isdigit() and code != "000" else None
    status.units = parse_units(results["units"].stdout)
    status.filesystems = parse_df(results["df"].stdout)
    elapsed = results["elapsed"].stdout.strip()
    if results["metrics"].stdout.strip():
        try:
            status.progress = parse_metrics(results["metrics"].stdout, float(elapsed) if elapsed.isdigit() else None)
        except ValueError as exc:
            status.metrics_error = str(exc)
    if results["output"].stdout.strip() != "present":
        status.output_missing = _missing_output(target)
    status.lock_holder = parse_lock_holder(results["lock"].stdout)
    holder = status.lock_holder
    if status.progress is None and holder is not None:  # running without --metrics-port: its lock says so
        status.metrics_error = (
            f"no answer on port {target.metrics_port}: the extractor runs without --metrics-port (pid {holder.pid} "
            f"on {holder.host} holds {target.output_dir}/{LOCK_FILE} since {holder.since}); start it with "
            f"--metrics-port {target.metrics_port} for progress and ETA"
        )
        status.progress = Progress(True, None, 0, holder.written, {"ok": holder.written}, 0, 0, {}, 0)
    elif not results["metrics"].stdout.strip():
        status.metrics_error = f"no answer on port {target.metrics_port} (the extractor is not running)"
    if status.progress is None:  # no extractor answers (finished or stopped): its output says how it ended
        status.progress = parse_data_config(results["data_config"].stdout) or status.progress
    for purpose, result in results.items():
        if purpose.startswith("log:"):
            status.logs[purpose[4:]] = result.stdout if result.exit_code == 0 else (result.stderr.strip() or result.stdout)
    return status


def _gather_one(target: Target, log_lines: int, make_runner: Callable[[Target], Runner]) -> HostStatus:
    try:
        runner = make_runner(target)
    except Exception as exc:  # any connection failure is reported per host
        return HostStatus(target.name, target.host or "this machine", reachable=False, error=_describe(exc, target))
    try:
        return gather(target, runner, log_lines)
    except Exception as exc:  # an SSH failure mid-way: reported per host, the others go on
        return HostStatus(target.name, target.host or "this machine", reachable=False, error=_describe(exc, target))
    finally:
        runner.close()


def _describe(exc: Exception, target: Target) -> str:
    where = f"{target.user + '@' if target.user else ''}{target.host}:{target.port or 22}"
    return f"{type(exc).__name__}: {exc} (ssh {where}; check the address, the key and that sshd runs)"


def default_runner(target: Target) -> Runner:
    return LocalRunner() if target.host is None else SSHRunner(target)


def gather_all(
    targets: Iterable[Target], log_lines: int = 0, make_runner: Callable[[Target], Runner] = default_runner
) -> list[HostStatus]:
    """Every target at once, one connection each."""
    targets = list(targets)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        return list(pool.map(lambda t: _gather_one(t, log_lines, make_runner), targets))


# -- report -----------------------------------------------------------------------------------------
def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s"


def render(status: HostStatus, shard: str = "") -> str:
    lines = [f"== {status.name} ({status.address}){' ' + shard if shard else ''}"]
    if not status.reachable:
        return "\n".join([*lines, f"  UNREACHABLE: {status.error}"])
    health = "no answer" if status.health is None else ("200 OK" if status.health == 200 else f"HTTP {status.health}")
    lines.append(f"  server health (/health_generate): {health}")
    lines.append("  units: " + ", ".join(f"{unit} {state}" for unit, state in status.units.items()))
    for fs in status.filesystems:
        lines.append(
            f"  {fs.path} (on {fs.mount}): {_gb(fs.used_bytes)} used of {_gb(fs.size_bytes)} ({fs.used_fraction:.0%}), "
            f"{_gb(fs.available_bytes)} free"
        )
    if status.output_missing:
        lines.append(f"  {status.output_missing}")
    p = status.progress
    if p is None:
        lines.append(f"  extraction: {status.metrics_error}")
    elif p.running and status.lock_holder is not None and p.planned == 0:  # no metrics: what its lock and files say
        lines.append(f"  extraction: running; {status.metrics_error}")
        lines.append(f"    samples written so far: {status.lock_holder.written} (samples.jsonl)")
    else:
        state = "running" if p.running else "not running (finished or stopped)"
        if p.outcome is not None:
            state = f"not running; its output's {DATA_CONFIG_FILE} says {p.outcome}"
        pct = f"{p.settled / p.planned:.1%}" if p.planned else "-"
        lines.append(f"  extraction: {state}; {p.settled}/{p.planned} samples settled ({pct}), {p.inflight} in flight")
        lines.append("    by status: " + ", ".join(f"{k} {v}" for k, v in sorted(p.by_status.items())))
        lines.append(
            f"    tokens: {p.tokens}/{p.tokens_planned}" + (f", {p.tokens_per_s:.0f} tokens/s" if p.tokens_per_s else "")
        )
        if p.errors:
            lines.append("    errors: " + ", ".join(f"{k} {v}" for k, v in sorted(p.errors.items())))
        if p.eta_s is not None and p.outcome is None:
            lines.append(
                f"    ETA: {duration(p.eta_s)} (average rate since the extractor started {duration(p.elapsed_s or 0)} ago)"
            )
        if p.server_up is False:
            lines.append("    the extractor saw the server fail: docs/runbooks/restart-server.md")
    for unit, text in status.logs.items():
        lines.append(f"  -- last log lines of {unit}:")
        lines.extend("     " + line for line in (text.rstrip().splitlines() or ["(none)"]))
    return "\n".join(lines)


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--inventory", type=Path, help="Ansible inventory (directory or file): look at its extraction_containers over SSH"
    )
    parser.add_argument("--logs", type=int, default=0, metavar="N", help="also print the last N log lines of each unit")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--ansible-inventory", help="the ansible-inventory program (default: found next to python or on PATH)")
    local = parser.add_argument_group("this machine (no --inventory)")
    local.add_argument(
        "--server-port", type=int, default=defaults.SERVER_PORT, help=f"server port (default: {defaults.SERVER_PORT})"
    )
    local.add_argument(
        "--metrics-port",
        type=int,
        default=defaults.METRICS_PORT,
        help=f"extractor metrics port (default: {defaults.METRICS_PORT})",
    )
    local.add_argument("--output-dir", default="work/output", help="output directory (default: work/output)")
    local.add_argument("--dump-dir", default="/dev/shm/hsextract-default", help="dump root (default: the default run's)")


def targets_from_args(args: Any) -> list[Target]:
    """The inventory's hosts with --inventory, else this machine with the local options."""
    if args.inventory is not None:
        return load_inventory(args.inventory, args.ansible_inventory)
    return [
        Target(
            "localhost",
            None,
            server_port=args.server_port,
            metrics_port=args.metrics_port,
            output_dir=args.output_dir,
            dump_dir=args.dump_dir,
        )
    ]


def to_json(statuses: list[HostStatus]) -> str:
    return json.dumps([asdict(s) for s in statuses], indent=2)
