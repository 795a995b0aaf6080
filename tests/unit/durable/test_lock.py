"""One extractor per output: the second one is refused at once, naming the holder."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from hsextract.durable.lock import LOCK_FILE, OutputLock
from hsextract.errors import OutputLockedError


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


def test_a_second_regenerate_or_prepare_is_told_which_command_holds_the_output(tmp_path: Path) -> None:
    """Regenerate's journal and prepare's staging folder lock through the same class, each naming its own
    command (regenerate's second run was told "another hsextract extract" holds it)."""
    import dataclasses

    from hsextract.prepare.provenance import Settings
    from hsextract.prepare.writer import PreparedWriter
    from hsextract.regen.journal import Journal

    journal = tmp_path / "out.journal"
    journal.mkdir()
    held = Journal(journal)._output_lock
    held.acquire()
    with pytest.raises(OutputLockedError, match="another hsextract regenerate"):
        Journal(journal)._output_lock.acquire()
    held.release()
    values: dict[str, Any] = {f.name: 0 if f.type in ("int", int) else "x" for f in dataclasses.fields(Settings)}
    settings = Settings(**values)
    first = PreparedWriter(tmp_path / "prepared", settings, progress=False)
    first.open()
    with pytest.raises(OutputLockedError, match="another hsextract prepare"):
        PreparedWriter(tmp_path / "prepared", settings, progress=False).open()
    first.close()
    PreparedWriter(tmp_path / "prepared", settings, progress=False).open()  # free again
