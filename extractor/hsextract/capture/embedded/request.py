"""One prompt in the embedded engine's queues: what it asked for, how far its prefill got, its future."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)  # compared by identity: the scheduler removes requests from its queues
class EngineRequest:
    rid: str
    input_ids: list[int]
    final_prenorm: bool = False  # dump the pre-norm final state too (the request asked for it)
    storage: str | None = None  # "float8_e4m3fn": quantize on the device, dump the FP8 layout
    spot_check: bool = False  # answer the engine's own hidden states (an unbatched forward), dump nothing
    future: Future[Any] = field(default_factory=Future)  # a dump's response dict, or a SpotCheckAnswer
    done_tokens: int = 0
    cache: Any = None
    arrived: float = field(default_factory=time.monotonic)
