"""The engine-agnostic HTTP front: SGLang's HTTP API subset (``/generate``, health, ``/server_info``,
``/metrics``) over any engine that implements :class:`ServedEngine` (``protocol.py``), as an ASGI app
(``asgi.py``) under uvicorn (``http.py``). The embedded transformers engine is one such engine; the next
capture backend is another."""

from hsextract.capture.front.http import HttpFront
from hsextract.capture.front.protocol import ServedEngine

__all__ = ["HttpFront", "ServedEngine"]
