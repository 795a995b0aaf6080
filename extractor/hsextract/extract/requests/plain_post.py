"""One request thread's HTTP/1.1 connection for the rows' ``/generate`` POSTs, on the standard library's http.client.

Every row goes out in one such request, alone or with others (:mod:`~hsextract.extract.requests.prefill_batches`).
Through ``httpx.Client`` one cost about 0.44 ms of the extractor's CPU (auth, redirect and hook layers, URL and
header models, httpcore's pool), most of it under the interpreter lock, which a fast forward makes the run's
limit; through http.client 0.15 ms (``bench/bench_http_client.py``). The rules are those of the httpx
connections in :mod:`~hsextract.extract.requests.http_threads`: a connection is used and closed only by the
thread that owns it; an idle one is closed before the server's keep-alive ends, or when the
server has closed it; another thread cancels a request by shutting its socket down (a blocked read fails at
once, no descriptor is freed under the owner). Failures are raised as the httpx exceptions of the same meaning,
so that callers handle one family.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping

import httpx


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle keep-alive connection with something to read: the server closed it (or broke the protocol)."""
    poller = select.poll()  # not select.select: descriptors past 1024 are common at --concurrency 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class PlainConnection:
    """A keep-alive connection to ``host:port``, opened on first use and again after it is dropped."""

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
        keepalive_expiry_s: float,
        refuse: Callable[[], bool],
        tls: bool = False,
    ) -> None:
        self._address = (host, port)
        self._tls = tls
        self._tls_context: ssl.SSLContext | None = None  # made at the first connection (loading the CAs takes a while)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._keepalive_expiry_s = keepalive_expiry_s
        self._refuse = refuse
        self._conn: http.client.HTTPConnection | None = None
        self._idle_since = 0.0
        self._lock = threading.Lock()  # the socket, between its owner and shutdown()
        self._sock: socket.socket | None = None

    def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """POST ``body`` and read the whole answer. httpx's ConnectError/ConnectTimeout when no connection could be
        made (or the run is stopping), ReadTimeout, or another httpx.TransportError for a broken exchange."""
        conn = self._connection()
        try:
            conn.request("POST", path, body=body, headers=dict(headers))
            response = conn.getresponse()
            content = response.read()
        except TimeoutError as exc:
            self._drop()
            raise httpx.ReadTimeout(f"no answer within {self._read_timeout_s} s: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        if response.will_close:
            self._drop()
        else:
            self._idle_since = time.monotonic()
        return httpx.Response(response.status, headers=response.getheaders(), content=content)

    def _connection(self) -> http.client.HTTPConnection:
        sock = self._sock
        if sock is not None and (time.monotonic() - self._idle_since > self._keepalive_expiry_s or _closed_by_peer(sock)):
            self._drop()
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> http.client.HTTPConnection:
        if self._refuse():
            raise httpx.ConnectError("the run is stopping: no new requests")
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout_s)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self._address[0]}:{self._address[1]}: {exc}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {self._address[0]}:{self._address[1]}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls:
            try:
                if self._tls_context is None:
                    self._tls_context = ssl.create_default_context()
                sock = self._tls_context.wrap_socket(sock, server_hostname=self._address[0])
            except OSError as exc:  # ssl.SSLError is one
                sock.close()
                raise httpx.ConnectError(f"TLS with {self._address[0]}:{self._address[1]}: {exc}") from exc
        sock.settimeout(self._read_timeout_s)
        conn = http.client.HTTPConnection(*self._address)
        conn.sock = sock
        with self._lock:
            self._sock = sock
        if self._refuse():  # cancelled while connecting: shutdown() may have missed this socket
            self._conn = conn
            self._drop()
            raise httpx.ConnectError("the run is stopping: no new requests")
        return conn

    def _drop(self) -> None:
        with self._lock:
            self._sock = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def shutdown(self) -> bool:
        """From any thread: fail the exchange under way at once (its read or write raises). True if a socket was open."""
        with self._lock:
            sock = self._sock
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False  # closed meanwhile by its owner
        return True

    def close(self) -> None:
        """By the owner, or once every request thread has ended."""
        self._drop()
