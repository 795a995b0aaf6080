"""The embedded server: a transformers model behind the subset of SGLang's HTTP API we use."""

from hsextract.capture.embedded.engine import Engine, EngineRequest
from hsextract.capture.embedded.http import EmbeddedServer

__all__ = ["EmbeddedServer", "Engine", "EngineRequest"]
