"""The scheduler threads' inbox: requests arrive on a queue, ``None`` asks the thread to stop."""

from __future__ import annotations

import queue
import threading
from collections.abc import MutableSequence
from typing import TypeVar

Item = TypeVar("Item")


def drain_inbox(inbox: queue.Queue[Item | None], waiting: MutableSequence[Item], stop: threading.Event, block: bool) -> None:
    """Move everything queued onto ``waiting`` (waiting up to 0.5 s for a first item when ``block``);
    a ``None`` sets ``stop``."""
    try:
        item = inbox.get(block=block, timeout=0.5 if block else None)
    except queue.Empty:
        return
    while item is not None:
        waiting.append(item)
        try:
            item = inbox.get_nowait()
        except queue.Empty:
            return
    stop.set()
