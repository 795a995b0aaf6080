"""``hsextract status`` (``make status``, ``make logs``): what the runbooks ask to look at, in seconds.

For each extraction host it gathers, with read-only commands only: the server's health (HTTP status of
``/health_generate``), the state of the ``hsextract-server`` and ``hsextract-extract`` units (and their
last log lines with ``--logs N``), ``/dev/shm`` and output disk use (``df -B1``), and the extraction's
progress and ETA from the extractor's own ``/metrics``: on the port the output's ``extract.lock`` records
when an extractor holds it (``--metrics-port`` of the run writing that output), else on the port given; a port
that answers with something else than an extractor's metrics is said so. For an extractor started without
``--metrics-port``, its pid from the output's ``extract.lock`` (held: ``/proc/locks``) and the samples
written so far, its total unknown; when the extractor is not running (finished, stopped, killed), the counts and the status
(complete, interrupted, stopped...) its output's ``data_config.json`` records; an output directory that
is not there is said. Hosts come from an Ansible inventory (group
``extraction_containers``, through ``ansible-inventory --list``) and are reached over SSH with fabric,
one connection per host, all hosts at once; with no inventory it looks at this machine (``--log-file``: the
last log lines of that file, the embedded default's server log, instead of the units' journals).

Per-host settings are the inventory's (``hsx_server_port``, ``hsx_metrics_port``, ``hsx_output_dir``,
``hsx_dump_dir``); the defaults match the embedded default run (``make extract``).
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hsextract.contract import defaults
from hsextract.durable.lock import LOCK_FILE
from hsextract.ops.inventory import Target, load_inventory
from hsextract.ops.runners import LocalRunner, Runner, SSHRunner
from hsextract.output.data_config import DATA_CONFIG_FILE
from hsextract.output.manifest import SAMPLES_FILE

log = logging.getLogger(__name__)

UNITS = ("hsextract-server", "hsextract-extract")


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
    planned: int | None  # None: unknown (an extractor without metrics)
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
    metrics_port: int | None = None  # the extractor's --metrics-port, as its lock records it (None: without one)
    metrics_host: str | None = None  # the address its metrics endpoint binds to
    records_metrics: bool = False  # the lock records the port (an extractor before issue 39 did not)

    def metrics_address(self) -> str:
        """Where this machine reaches the holder's metrics endpoint: its bind address, loopback for a wildcard."""
        host = self.metrics_host or "127.0.0.1"
        if host in ("0.0.0.0", "::", "*"):
            return "127.0.0.1"
        return f"[{host}]" if ":" in host else host


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
    metrics_port: int | None = None  # the port /metrics was read on: the lock's when the running extractor records one
    metrics_http: int | None = None  # the HTTP status that port answered; None: no answer
    logs: dict[str, str] = field(default_factory=dict)
    lock_holder: LockHolder | None = None  # an extractor holds the output (with or without metrics)
    output_missing: str | None = None  # why no output was read: its directory is not there


_CURL = {
    "code": "curl -s -m 30 -o /dev/null -w '%{{http_code}}' {url}",
    "body": "curl -sf -m 10 {url}",
    "both": "curl -s -m 10 -w '\\n%{{http_code}}' {url}",
}
_PYTHON = {"code": "r.status", "body": "r.read().decode()", "both": "r.read().decode()+chr(10)+str(r.status)"}
_PYTHON_ERROR = {"code": "getattr(e,'code','000')", "body": "''", "both": "chr(10)+str(getattr(e,'code','000'))"}


def _http_get(url: str, what: str) -> str:
    """Shell printing the status code (what=code), the body (what=body), or the body, a newline and the status
    code (what=both: 000 when nothing answers) of a GET, with curl or else python3."""
    py = (
        "import urllib.request as u\n"
        f"try:\n r=u.urlopen({url!r},timeout=30)\n print({_PYTHON[what]},end='')\n"
        f"except Exception as e:\n print({_PYTHON_ERROR[what]},end='')"
    )
    return f"if command -v curl >/dev/null; then {_CURL[what].format(url=url)}; else python3 -c {shlex.quote(py)}; fi"


def _metrics_command(address: str, port: int) -> str:
    return _http_get(f"http://{address}:{port}/metrics", "both")


def _elapsed_command(port: int) -> str:
    """Shell printing the age in seconds of the process listening on ``port``."""
    return f"pid=$(fuser -n tcp {port} 2>/dev/null | awk '{{print $1}}'); " '[ -n "$pid" ] && ps -o etimes= -p "$pid"'


def split_answer(stdout: str) -> tuple[int | None, str]:
    """(HTTP status, body) from :func:`_http_get`'s ``both`` output; status None when nothing answered."""
    body, _, code = stdout.rpartition("\n")
    code = code.strip()
    return (int(code) if code.isdigit() and int(code) > 0 else None), body


def status_commands(target: Target, log_lines: int) -> dict[str, str]:
    """The read-only shell commands run on a target, by purpose."""
    units = " ".join(UNITS)
    sudo = "sudo -n " if target.become else ""
    commands = {
        "health": _http_get(f"http://127.0.0.1:{target.server_port}/health_generate", "code"),
        "units": f"command -v systemctl >/dev/null && systemctl is-active {units}",
        "df": "df -B1 --output=file,target,size,used,avail /dev/shm "
        f"{shlex.quote(target.dump_dir)} {shlex.quote(target.output_dir)}",
        "metrics": _metrics_command("127.0.0.1", target.metrics_port),
        "data_config": f"cat {shlex.quote(target.output_dir + '/' + DATA_CONFIG_FILE)} 2>/dev/null",
        "output": f"test -d {shlex.quote(target.output_dir)} && echo present",
        "lock": _lock_holder_command(target.output_dir),
        "elapsed": _elapsed_command(target.metrics_port),
    }
    if log_lines > 0 and target.log_file:  # this machine's embedded default: its server log, not systemd units
        commands[f"log:{target.log_file}"] = f"tail -n {int(log_lines)} {shlex.quote(target.log_file)}"
    elif log_lines > 0:
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
    port, host = record.get("metrics_port"), record.get("metrics_host")
    return LockHolder(int(pid), str(record.get("host", "?")), str(record.get("since", "?")),
                      int(written) if written.isdigit() else 0, port if isinstance(port, int) and port > 0 else None,
                      host if isinstance(host, str) else None, "metrics_port" in record)  # fmt: skip


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
    if results["output"].stdout.strip() != "present":
        status.output_missing = _missing_output(target)
    status.lock_holder = holder = parse_lock_holder(results["lock"].stdout)
    address, port = "127.0.0.1", target.metrics_port
    if holder is not None and holder.metrics_port is not None:  # the port of the run writing this output, not a guess
        address, port = holder.metrics_address(), holder.metrics_port
        if (address, port) != ("127.0.0.1", target.metrics_port):
            results["metrics"] = runner.run(_metrics_command(address, port))
            results["elapsed"] = runner.run(_elapsed_command(port))
    status.metrics_port = port
    status.metrics_http, body = split_answer(results["metrics"].stdout)
    elapsed = results["elapsed"].stdout.strip()
    fix = ("give status the extractor's --metrics-port" if target.host is None
           else "set hsx_metrics_port to the extractor's --metrics-port")  # fmt: skip
    if status.metrics_http == 200:
        try:
            status.progress = parse_metrics(body, float(elapsed) if elapsed.isdigit() else None)
        except ValueError as exc:
            status.metrics_error = f"port {port} answers, but is not an hsextract metrics endpoint ({exc}); {fix}"
    elif status.metrics_http is not None:
        status.metrics_error = (f"port {port} answers HTTP {status.metrics_http} on /metrics: not an hsextract metrics "
                                f"endpoint; {fix}")  # fmt: skip
    if status.progress is None and holder is not None:  # running, but no progress read: what its lock says
        status.metrics_error = _no_progress(target, holder, port, status.metrics_error)
        status.progress = Progress(True, None, None, holder.written, {"ok": holder.written}, 0, 0, {}, 0)
    elif status.progress is None and status.metrics_error is None:
        status.metrics_error = f"no answer on port {port} (the extractor is not running)"
    if status.progress is None:  # no extractor answers (finished or stopped): its output says how it ended
        status.progress = parse_data_config(results["data_config"].stdout) or status.progress
    for purpose, result in results.items():
        if purpose.startswith("log:"):
            status.logs[purpose[4:]] = result.stdout if result.exit_code == 0 else (result.stderr.strip() or result.stdout)
    return status


def _no_progress(target: Target, holder: LockHolder, port: int, answered: str | None) -> str:
    """Why a running extractor (it holds the output's lock) gave no progress, from what its lock records."""
    held = f"pid {holder.pid} on {holder.host} holds {target.output_dir}/{LOCK_FILE} since {holder.since}"
    if answered is not None:  # the port answered, with something else than an extractor's metrics
        return f"{answered} ({held})"
    if holder.metrics_port is not None:
        return (f"the extractor ({held}) runs with --metrics-port {port}, which does not answer yet: it serves its "
                "metrics once its server answers and the resume check is done")  # fmt: skip
    if holder.records_metrics:
        return (f"no answer on port {port}: the extractor runs without --metrics-port ({held}); start it with "
                f"--metrics-port {port} for progress and ETA; its total is unknown")  # fmt: skip
    setting = "--metrics-port" if target.host is None else "hsx_metrics_port"
    return (f"no answer on port {port}; the extractor ({held}) records no metrics port in its lock (an older "
            f"hsextract): if it runs with --metrics-port, give status that port ({setting}); its total is unknown")


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
    elif p.running and status.lock_holder is not None and p.planned is None:  # no metrics: its lock and files
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
        if p.outcome is not None and status.metrics_http is not None and status.metrics_error:
            lines.append(f"    {status.metrics_error}")  # what answered on the metrics port instead
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
    local.add_argument(
        "--log-file",
        help="with --logs N: the last N lines of this file instead of the units' journals (make logs without an "
        "inventory: make extract's WORK/server.log)",
    )


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
            log_file=args.log_file,
        )
    ]


def to_json(statuses: list[HostStatus]) -> str:
    return json.dumps([asdict(s) for s in statuses], indent=2)
