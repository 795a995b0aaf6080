"""Request ids: the name of a dump directory, so strictly validated.

A rid is ``<prefix>-<9-digit dataset row>-n<expected token count>``. The server dumps only
rids of exactly this form; anything else (health checks, warm-up) is ignored and never
becomes a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hsextract.contract.defaults import RID_PREFIX
from hsextract.errors import BadSampleError, ConfigError

DEFAULT_PREFIX = RID_PREFIX
_PREFIX_RE = re.compile(r"^[A-Za-z0-9]{1,32}$")
MAX_ROW = 999_999_999


@dataclass(frozen=True)
class Rid:
    prefix: str
    row: int
    num_tokens: int

    def __str__(self) -> str:
        return f"{self.prefix}-{self.row:09d}-n{self.num_tokens}"


def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise ConfigError(f"rid prefix {prefix!r} must be 1-32 letters or digits; choose another rid_prefix")
    return prefix


def make_rid(row: int, num_tokens: int, prefix: str = DEFAULT_PREFIX) -> str:
    check_prefix(prefix)
    if not 0 <= row <= MAX_ROW:
        raise BadSampleError("row_out_of_range", f"row {row} does not fit the 9-digit rid field (0..{MAX_ROW})")
    if num_tokens <= 0:
        raise BadSampleError("empty", f"num_tokens must be positive, got {num_tokens}")
    return str(Rid(prefix, row, num_tokens))


def parse_rid(rid: object, prefix: str = DEFAULT_PREFIX) -> Rid | None:
    """Return the parsed rid, or None for anything that is not exactly ``<prefix>-ddddddddd-nT``."""
    if not isinstance(rid, str) or not _PREFIX_RE.match(prefix):
        return None
    match = re.fullmatch(re.escape(prefix) + r"-(\d{9})-n([1-9]\d{0,8})", rid)
    if match is None:
        return None
    return Rid(prefix, int(match.group(1)), int(match.group(2)))
