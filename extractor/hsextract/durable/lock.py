"""One writer per output: an exclusive ``flock`` on ``<out>/extract.lock`` (or the file the command names),
held for the run; ``extract`` and ``regenerate`` lock their output, ``prepare`` its staging folder.

The kernel drops the lock when the holder dies (SIGKILL, crash, reboot), so a stale lock never
blocks a resume. The file holds the holder's pid, host and start time for the message a second
extractor gets, and what the holder adds (an extractor: its metrics port, for ``hsextract status``);
the holder removes it when it is done.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from hsextract.durable.sync import sync_dir
from hsextract.errors import OutputLockedError

log = logging.getLogger(__name__)

LOCK_FILE = "extract.lock"


class OutputLock:
    def __init__(
        self,
        output: Path,
        details: Mapping[str, object] | None = None,
        command: str = "extract",
        name: str = LOCK_FILE,
        refusal: str | None = None,
    ) -> None:
        self.output = Path(output)
        self.details = dict(details or {})  # recorded in the file beside pid, host and since
        self.command = command  # the hsextract command that writes the output: named to a second one
        self.path = self.output / name
        # what a second holder is told, {holder} filled in; the default is the output's
        self.refusal = refusal or (
            f"output {self.output} is being written by another hsextract {command} ({{holder}}); wait for it "
            "to finish or stop it, or choose another --output"
        )
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`OutputLockedError` at once, naming the holder."""
        if self._fd is not None:
            return
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._describe_holder(fd)
                os.close(fd)
                raise OutputLockedError(self.refusal.replace("{holder}", holder)) from None  # a path may hold braces
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # the previous holder removed the file between our open and flock
                os.close(fd)
                continue
            record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      **self.details}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            self._fd = fd
            return
        raise OutputLockedError(f"could not take the lock {self.path}: it keeps being replaced; is another extractor starting?")

    @staticmethod
    def _describe_holder(fd: int) -> str:
        try:
            record = json.loads(os.pread(fd, 4096, 0) or b"{}")
            writing = f", writing {record['output']}" if record.get("output") else ""
            return f"pid {record['pid']} on host {record['host']}, since {record['since']}{writing}"
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that has not yet written its pid"

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # before unlocking: a waiter then finds the file gone and retries
            sync_dir(self.output)  # a finished output has no lock file, after a power loss too
        os.close(self._fd)
        self._fd = None
