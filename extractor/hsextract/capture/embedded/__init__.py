"""The embedded engine: a transformers model that implements the HTTP front's
:class:`~hsextract.capture.front.protocol.ServedEngine` (served by :class:`~hsextract.capture.front.HttpFront`).

``Engine`` loads on first use: ``hsextract.capture.embedded.config`` (the ``serve`` options the CLI builds its
parser from) must import without torch, as in the SGLang image where the launcher runs before torch is there.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hsextract.capture.embedded.engine import Engine
    from hsextract.capture.embedded.request import EngineRequest
    from hsextract.capture.front.protocol import ServedEngine

    _implements: type[ServedEngine] = Engine  # mypy checks that the engine implements the front's protocol


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from hsextract.capture.embedded.engine import Engine

        return Engine
    if name == "EngineRequest":
        from hsextract.capture.embedded.request import EngineRequest

        return EngineRequest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Engine", "EngineRequest"]
