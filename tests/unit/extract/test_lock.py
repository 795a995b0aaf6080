"""One extractor per output: the second one is refused at once, naming the holder."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from hsextract.errors import OutputLockedError
from hsextract.extract.lock import LOCK_FILE, OutputLock


def test_a_second_holder_is_refused_and_the_lock_is_free_after_release(tmp_path: Path) -> None:
    first, second = OutputLock(tmp_path), OutputLock(tmp_path)
    first.acquire()
    with pytest.raises(OutputLockedError) as caught:
        second.acquire()  # flock is per open file: a second open in this process conflicts as another process would
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(caught.value)
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    second.acquire()
    with pytest.raises(OutputLockedError):  # the second one holds it now
        OutputLock(tmp_path).acquire()
    second.release()


def test_a_lock_file_left_behind_does_not_block(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text('{"pid": 1, "host": "gone", "since": "then"}\n')  # its holder died: no flock
    lock = OutputLock(tmp_path)
    lock.acquire()
    assert str(os.getpid()) in (tmp_path / LOCK_FILE).read_text()
    lock.release()
