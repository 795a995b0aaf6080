"""Starting, driving and stopping the power-loss filesystem (lossy_fs.py) from the tests.

``LossyMount.start(tmp_dir)`` mounts a fresh, empty filesystem at ``tmp_dir/mnt`` in its own process
(this interpreter) and returns once it answers on its control socket and is mounted; ``cut()``,
``persist()``, ``persist_all()`` and ``stats()`` are the control requests; ``stop()`` unmounts and never
leaves a mount behind. What the machine lacks for it is an error naming the fix, not a skip.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DAEMON = Path(__file__).with_name("lossy_fs.py")
FIX = "make powerloss-deps"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class LossyFsError(RuntimeError):
    """The power-loss filesystem cannot run here, or did not start or answer."""


def check_prerequisites() -> None:
    missing = [
        what
        for what, present in (
            ("/dev/fuse", os.path.exists("/dev/fuse")),
            ("fusermount3 (Debian package fuse3)", shutil.which("fusermount3") is not None),
            ("libfuse3 (Debian packages fuse3, libfuse3-dev)", ctypes.util.find_library("fuse3") is not None),
        )
        if not present
    ]
    if missing:
        raise LossyFsError(f"the power-loss filesystem needs {', '.join(missing)}: run `{FIX}` (as root)")
    if importlib.util.find_spec("mfusepy") is None:
        raise LossyFsError(f"the power-loss filesystem needs the Python package mfusepy in {sys.executable}: run `make setup`")


def is_mounted(path: Path) -> bool:
    """From the mount table, not stat: a mount whose daemon died still counts (``os.path.ismount`` says no)."""
    escaped = str(path).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    with open("/proc/self/mounts") as table:
        return any(line.split(" ")[1] == escaped for line in table)


def unmount(path: Path) -> None:
    """Unmount ``path`` if mounted: fusermount3 -u, else a lazy umount."""
    for command in (["fusermount3", "-u", "-q", str(path)], ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return
        subprocess.run(command, capture_output=True, check=False)
    if is_mounted(path):
        raise LossyFsError(f"could not unmount {path}")


@dataclass
class LossyMount:
    path: Path
    control: Path
    log: Path
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, tmp_dir: Path) -> LossyMount:
        check_prerequisites()
        mountpoint = Path(tmp_dir) / "mnt"
        mountpoint.mkdir(parents=True)
        control = Path(tempfile.mkdtemp(prefix="lossyfs-")) / "control.sock"  # short: AF_UNIX paths are <= 107 bytes
        log = Path(tmp_dir) / "lossy_fs.log"
        with open(log, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(DAEMON), str(mountpoint), "--control", str(control)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        mount = cls(mountpoint, control, log, process)
        try:
            mount.wait_ready()
        except BaseException:
            mount.stop()
            raise
        return mount

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise LossyFsError(f"lossy_fs.py exited ({self.process.returncode}) before it was ready:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.request("ping")["ok"] and os.path.ismount(self.path):
                    return
            if time.monotonic() > deadline:
                raise LossyFsError(f"lossy_fs.py was not ready after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:] or "(its stderr is empty)"
        except OSError as error:
            return f"(no stderr: {error})"

    def request(self, line: str) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(60)
            connection.connect(str(self.control))
            with connection.makefile("rwb") as stream:
                stream.write(line.encode() + b"\n")
                stream.flush()
                reply: dict[str, Any] = json.loads(stream.readline() or b"null") or {"ok": False, "error": "no reply"}
        if not reply["ok"]:
            raise LossyFsError(f"lossy_fs.py refused {line!r}: {reply.get('error')}")
        return reply

    def cut(self) -> dict[str, Any]:
        """The power cut: only what was durable remains; handles opened before it are dead."""
        return self.request("cut")

    def persist(self, max_bytes: int) -> dict[str, Any]:
        """Early writeback: files of at most ``max_bytes`` and all directory entries become durable."""
        return self.request(f"persist {int(max_bytes)}")

    def persist_all(self) -> dict[str, Any]:
        """Everything durable, as a clean shutdown leaves it."""
        return self.request("persist_all")

    def stats(self) -> dict[str, Any]:
        """What a cut would lose now: volatile_files, volatile_bytes, volatile_dirs, and inode counts."""
        return self.request("stats")

    def stop(self) -> None:
        """Terminate the daemon (it unmounts on SIGTERM), kill it if it hangs, and unmount what is left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            unmount(self.path)
        finally:
            shutil.rmtree(self.control.parent, ignore_errors=True)
