"""What the HTTP front needs of a capture backend: the seam a new engine implements.

:class:`~hsextract.capture.embedded.engine.Engine` (a transformers model) implements it today; the
front (:mod:`~hsextract.capture.front.asgi`, :mod:`~hsextract.capture.front.http`) knows nothing else
of it.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from hsextract.capture.stages import StageClock


class ServedEngine(Protocol):
    """An engine served by :class:`~hsextract.capture.front.http.HttpFront`."""

    vocab_size: int
    model_path: Path
    clock: StageClock  # its registry is what /metrics shows

    def submit(
        self, rid: str, input_ids: list[int], final_prenorm: bool = False, storage: str | None = None
    ) -> Future[dict[str, Any]]:
        """Queue one prompt; the future resolves to its ``/generate`` answer once its dump is written."""
        ...

    def info_json(self) -> dict[str, Any]:
        """The ``/server_info`` body."""
        ...

    def shutdown(self) -> None:
        """After the last answer: stop forwarding, flush the dumps."""
        ...
