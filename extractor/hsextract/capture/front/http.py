"""The HTTP server of the front: the routes of :mod:`~hsextract.capture.front.asgi` under uvicorn, serving
any :class:`~hsextract.capture.front.protocol.ServedEngine` (the embedded engine is one).

The same stack as SGLang's own server (an ASGI app under uvicorn, HTTP/1.1 through h11):

- the socket is bound and listening when :class:`HttpFront` is made, so :attr:`~HttpFront.port`
  is known at once (port 0 picks a free one) and connections wait in the backlog until
  :meth:`~HttpFront.serve_forever` runs;
- keep-alive: an idle connection is closed after :data:`KEEP_ALIVE_S`;
- request bodies are bounded (:data:`~hsextract.capture.front.asgi.MAX_BODY_BYTES`, 413 beyond);
- graceful shutdown, on SIGTERM/SIGINT (when serving in the main thread) or
  :meth:`~HttpFront.shutdown`: no new connections, idle ones closed, open requests get
  ``grace_s`` (:data:`SHUTDOWN_GRACE_S`) to finish and those still open then answer 503 ("server
  shutting down"); none is cut off. Then :meth:`~HttpFront.shutdown` stops the engine, which
  flushes its dump writers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import threading
from collections.abc import Generator
from types import FrameType

import uvicorn

from hsextract.capture.front.asgi import MAX_BODY_BYTES, build_app
from hsextract.capture.front.drain import Drain
from hsextract.capture.front.protocol import ServedEngine

log = logging.getLogger(__name__)

#: seconds an idle keep-alive connection stays open (SGLang's uvicorn setting)
KEEP_ALIVE_S = 5
#: seconds open requests get to finish at shutdown before they answer 503; well inside the
#: systemd unit's TimeoutStopSec (90 s, roles/hsx_server), which also covers flushing the dumps
SHUTDOWN_GRACE_S = 30.0
#: seconds past the grace after which uvicorn cancels what still runs (a client that does not read its answer)
SHUTDOWN_BACKSTOP_S = 10
LISTEN_BACKLOG = 2048  # an extractor opens --concurrency connections at once
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HttpFront:
    """Serve an engine (a :class:`~hsextract.capture.front.protocol.ServedEngine`, e.g. the embedded
    :class:`~hsextract.capture.embedded.engine.Engine`) over HTTP, from
    :meth:`serve_forever` until :meth:`shutdown` or a signal.

    Raises :class:`OSError` when ``host:port`` cannot be bound.
    """

    def __init__(
        self,
        engine: ServedEngine,
        host: str,
        port: int,
        *,
        grace_s: float = SHUTDOWN_GRACE_S,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.engine = engine
        self._socket = _listen(host, port)
        self._drain = Drain(grace_s)
        config = uvicorn.Config(
            build_app(engine, self._drain, max_body_bytes),
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=math.ceil(grace_s) + SHUTDOWN_BACKSTOP_S,
            backlog=LISTEN_BACKLOG,
            lifespan="off",
            log_config=None,  # the process's logging stays as the caller set it up
            access_log=False,
        )
        self._uvicorn = _Uvicorn(config, self._drain)
        self._lock = threading.Lock()
        self._serving = False
        self._stopping = False
        self._engine_stopped = False
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` or, in the main thread, SIGTERM/SIGINT; return once every open
        request is answered. The engine keeps running: :meth:`shutdown` stops it."""
        with self._lock:
            if self._stopping or self._serving:
                return
            self._serving = True
        try:
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._socket.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving (see the module docstring), wait until every open request is answered, stop the engine."""
        with self._lock:
            self._stopping = True
            serving = self._serving
        self._uvicorn.should_exit = True
        if serving:
            self._stopped.wait()
        else:
            self._socket.close()
        with self._lock:
            if self._engine_stopped:
                return
            self._engine_stopped = True
        self.engine.shutdown()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, with the drain started at shutdown and signals handled without re-raising them."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._drain.begin()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn raises a caught signal again once it has stopped, which would kill the process
        # before the engine flushes its dumps; here the caller of serve_forever goes on instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.should_exit and signum == signal.SIGINT:
            log.warning("%s again: stopping now, open requests are cut off", name)
            self.force_exit = True
            return
        log.info("%s: no new connections; open requests get %.0f s to finish", name, self._drain.grace_s)
        self.should_exit = True


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)  # asyncio sets TCP_NODELAY on each connection
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart does not wait for TIME_WAIT
        sock.bind((host, port))  # its OSError's strerror is what hsextract serve reports
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
