"""How ``hsextract status`` runs its shell commands on a target: this machine through bash, or a host
over one reused SSH connection (fabric). A runner never raises for a non-zero exit."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from hsextract.ops.inventory import Target

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
