"""The embedded server: a transformers model behind the subset of SGLang's HTTP API we use."""

from .engine import Engine, EngineRequest
from .http import EmbeddedServer

__all__ = ["EmbeddedServer", "Engine", "EngineRequest"]
