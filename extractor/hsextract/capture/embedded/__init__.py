"""The embedded engine: a transformers model that implements the HTTP front's
:class:`~hsextract.capture.front.protocol.ServedEngine` (served by :class:`~hsextract.capture.front.HttpFront`)."""

from typing import TYPE_CHECKING

from hsextract.capture.embedded.engine import Engine, EngineRequest

if TYPE_CHECKING:
    from hsextract.capture.front.protocol import ServedEngine

    _implements: type[ServedEngine] = Engine  # mypy checks that the engine implements the front's protocol

__all__ = ["Engine", "EngineRequest"]
