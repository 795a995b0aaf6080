"""An httpx transport whose requests in flight can be cancelled from another thread.

A request to a hung server blocks its thread in ``recv`` until the read timeout (600 s by default),
and closing a socket from another thread does not wake it. :meth:`CancellableTransport.cancel`
shuts every open connection down (``shutdown(SHUT_RDWR)``), which does: the blocked request fails
at once with a transport error. Connections opened after ``cancel`` fail immediately. This is how
SIGTERM ends a run within seconds even while requests hang.
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx


class _CancelledError(httpcore.ConnectError):
    pass


class _TrackingBackend(httpcore.NetworkBackend):
    """httpcore's own sync backend, remembering each socket it opens."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.cancelled = False

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self.cancelled:
            raise _CancelledError("the run is stopping: no new requests")
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        sock = stream.get_extra_info("socket")
        with self._lock:
            if isinstance(sock, socket.socket):
                self._sockets.add(sock)
            cancelled = self.cancelled
        if cancelled:
            stream.close()
            raise _CancelledError("the run is stopping: no new requests")
        return stream

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("unix sockets are not used by hsextract")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)

    def cancel(self) -> int:
        """Shut every open connection down; return how many."""
        with self._lock:
            self.cancelled = True
            sockets = list(self._sockets)
        count = 0
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
            except OSError:
                pass  # already closed
        return count


def _mapped(exc: Exception) -> Exception:
    """The httpx exception of the same name (httpx mirrors httpcore's tree)."""
    for cls in type(exc).__mro__:
        target = getattr(httpx, cls.__name__, None)
        if isinstance(target, type) and issubclass(target, httpx.TransportError):
            return target(str(exc) or type(exc).__name__)
    return httpx.TransportError(str(exc) or type(exc).__name__)


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpcore.TimeoutException as exc:
            raise _mapped(exc) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise _mapped(exc) from exc

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class CancellableTransport(httpx.BaseTransport):
    def __init__(self, limits: httpx.Limits) -> None:
        self._backend = _TrackingBackend()
        self._pool = httpcore.ConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=self._backend,
        )

    def cancel(self) -> int:
        return self._backend.cancel()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = self._pool.handle_request(core_request)
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise _mapped(exc) from exc
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()
