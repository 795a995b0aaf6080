"""One extractor per server and shard: an exclusive ``flock`` in the server's dump folder, named for
the rid prefix and the shard, held from before the start-up sweep of stale dumps to the end of the run.

A request id is ``<prefix>-<row>-n<tokens>`` and a server dumps only its own prefix, so two extractors
of one shard on one server give the same row of the same length the same id: each can take the
other's dump, and each one's sweep at its start and end removes the other's in-flight dumps (those rows
then wait ``dump_timeout_s``). The dump checks make that loud, not silent; this lock makes the second
extractor stop before its first request, naming the holder. Other shards of the same server take other
locks. The kernel drops the lock when its holder dies.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hsextract.durable.lock import OutputLock

log = logging.getLogger(__name__)


def take_dump_folder_lock(dump_dir: Path, output: Path, rid_prefix: str, shard_index: int, num_shards: int) -> OutputLock | None:
    """Take this shard's lock, or raise :class:`OutputLockedError` naming the holder. A folder that takes
    no lock file (read-only to us, gone) is warned about, not fatal: the run goes on without the guard."""
    lock = dump_folder_lock(dump_dir, output, rid_prefix, shard_index, num_shards)
    try:
        lock.acquire()
    except OSError as exc:
        log.warning("no lock file in the dump folder %s (%s): a second extractor of this shard on this server "
                    "would not be stopped", dump_dir, exc)  # fmt: skip
        return None
    return lock


def dump_folder_lock(dump_dir: Path, output: Path, rid_prefix: str, shard_index: int, num_shards: int) -> OutputLock:
    """The (unacquired) lock of this shard in ``dump_dir``; its record names the output it writes."""
    return OutputLock(
        dump_dir,
        {"output": str(output)},
        name=f".hsextract-{rid_prefix}-shard{shard_index}of{num_shards}.lock",
        refusal=(
            f"the server's dump folder {dump_dir} is in use by another hsextract extract of shard {shard_index} of "
            f"{num_shards} ({{holder}}): two extractors of one shard on one server take each other's dumps (the same "
            "request id for the same row and length). Wait for it or stop it, or give each run its own shard "
            "(--shard-index/--num-shards)"
        ),
    )
