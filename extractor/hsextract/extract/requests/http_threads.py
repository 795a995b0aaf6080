"""HTTP requests on threads that each own their connection; a request can be waited on, polled,
cancelled or abandoned.

Why each thread owns its connection. httpcore's sync ``ConnectionPool``, shared by the worker
threads until issue 16, picks the idle connections to close (keep-alive expired, or more idle ones
than it keeps: it compares its whole pool, busy connections included, with that number) under its
lock and closes them after releasing it. Meanwhile another thread may have been handed one of them
and sent its request on it. That thread then waits in ``poll`` on a socket closed under it: ``close``
does not wake it, and once a new connection reuses the file descriptor it waits on the wrong socket.
The server has answered on the old one; the request hangs until its read timeout (600 s). That was
the stall on the H200 (``tests/test_http_threads.py`` replays it). Here every request thread has its
own one-connection client: a connection is only ever used and closed by the thread that holds it.
Stopping is ``shutdown(SHUT_RDWR)`` on the sockets, which wakes a blocked reader and frees no
descriptor. The rows' POSTs go out on a second connection of the same thread, on http.client
(:mod:`~hsextract.extract.requests.plain_post` says why), under the same rules.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import httpcore
import httpx

from hsextract.extract.requests.plain_post import PlainConnection

T = TypeVar("T")

log = logging.getLogger(__name__)

#: An idle connection is closed by its thread before SGLang's uvicorn closes it (``timeout_keep_alive``
#: 5 s), so a request never goes out on a connection the server is closing at that moment.
KEEPALIVE_EXPIRY_S = 4.0


class RequestsCancelled(Exception):
    """The run is stopping: this request was cancelled, or refused because the client is cancelled."""


class _CancelledConnect(httpcore.ConnectError):
    pass


class _TrackingBackend(httpcore.NetworkBackend):
    """httpcore's own sync backend, remembering each socket it opens (to shut them down)."""

    def __init__(self, refuse: Callable[[], bool]) -> None:
        self._backend = httpcore.SyncBackend()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._refuse = refuse

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self._refuse():
            raise _CancelledConnect("the run is stopping: no new requests")
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.add(sock)
        if self._refuse():
            stream.close()
            raise _CancelledConnect("the run is stopping: no new requests")
        return stream

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("unix sockets are not used by hsextract")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)

    def shutdown(self) -> int:
        """Shut every open connection down (a blocked read fails at once); return how many."""
        with self._lock:
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
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise _mapped(exc) from exc

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class _OwnTransport(httpx.BaseTransport):
    """One thread's transport: an httpcore pool of one connection on a tracking backend."""

    def __init__(self, refuse: Callable[[], bool], keepalive_expiry_s: float) -> None:
        self.backend = _TrackingBackend(refuse)
        self._pool = httpcore.ConnectionPool(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=keepalive_expiry_s, network_backend=self.backend
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port, target=request.url.raw_path
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


class _Timers:
    """Callbacks after a delay, on one thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hsextract-timers", daemon=True)
        self._thread.start()

    def later(self, delay_s: float, callback: Callable[[], object]) -> None:
        with self._wake:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._order), callback))
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._wake.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._heap)
            callback()


class _HandOff:
    """Threads that take work from a ``queue.SimpleQueue``: a hand-off that takes no Python lock.

    ``ThreadPoolExecutor.submit`` takes the pool's lock and the process-wide ``_global_shutdown_lock``. With
    hundreds of row threads wanting the GIL, a thread holding them is preempted and the others queue behind it:
    on the H200 the row threads of 3000 short rows spent 0.805 of their time there, the request threads sat idle
    and the server, starved, batched 1.7 rows (``bench/results-gpu-e2e-profiles.json``). A thread waiting for
    work leaves a token in ``_idle``; each submit takes one, or starts a thread (up to ``max_threads``)."""

    def __init__(self, max_threads: int, name: str) -> None:
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._numbers = itertools.count()  # next() is atomic: no lock to count the threads started
        self._max_threads, self._name = max_threads, name
        self._threads: list[threading.Thread] = []

    def submit(self, work: Callable[[], None]) -> None:
        self._work.put(work)
        try:
            self._idle.get_nowait()  # a waiting thread takes the work
        except queue.Empty:
            number = next(self._numbers)
            if number < self._max_threads:  # beyond, the work waits for the next thread to finish
                thread = threading.Thread(target=self._serve, name=f"{self._name}_{number}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:  # the work sets its own future: this is a bug in it, not the request's failure
                log.exception("a request thread's work failed")
            self._idle.put(None)

    def shutdown(self) -> None:
        """Run what is queued (after a cancel it fails at once), then stop every thread and wait for it."""
        stopped = 0
        while stopped < len(self._threads):  # a submit racing the shutdown may have started one more
            threads = self._threads[stopped:]
            for _ in threads:
                self._work.put(None)
            for thread in threads:
                thread.join()
            stopped += len(threads)


class _Connections:
    """One request thread's connections: an httpx client on its own transport, and a plain one for the rows' POSTs."""

    def __init__(self, base_url: str, timeout: httpx.Timeout, keepalive_expiry_s: float, refuse: Callable[[], bool]) -> None:
        self.transport = _OwnTransport(refuse, keepalive_expiry_s)
        self.client = httpx.Client(base_url=base_url, timeout=timeout, transport=self.transport)
        url = httpx.URL(base_url)
        tls = url.scheme == "https"
        port = url.port if url.port is not None else (443 if tls else 80)
        self.plain = PlainConnection(url.host, port, timeout.connect, timeout.read, keepalive_expiry_s, refuse, tls)

    def shutdown(self) -> None:
        self.transport.backend.shutdown()
        self.plain.shutdown()

    def close(self) -> None:
        self.client.close()
        self.plain.close()


class ThreadedHTTP:
    """Runs ``work(client)`` on a pool thread with that thread's own ``httpx.Client`` (or, :meth:`submit_plain`,
    ``work(connection)`` with its own :class:`~hsextract.extract.requests.plain_post.PlainConnection`)."""

    def __init__(
        self, base_url: str, timeout: httpx.Timeout, max_threads: int, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S
    ) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._keepalive_expiry_s = keepalive_expiry_s
        self._threads = _HandOff(max_threads, "hsextract-http")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cancelled = False
        self._connections: list[_Connections] = []
        self._running: dict[Future[Any], _Connections] = {}
        self._timers = _Timers()

    def _refuse(self) -> bool:
        return self._cancelled

    def _thread_connections(self) -> _Connections:
        connections: _Connections | None = getattr(self._local, "connections", None)
        if connections is None:
            connections = _Connections(self._base_url, self._timeout, self._keepalive_expiry_s, self._refuse)
            self._local.connections = connections
            with self._lock:
                self._connections.append(connections)
        return connections

    def submit(self, work: Callable[[httpx.Client], T]) -> Future[T]:
        """Start ``work`` on a request thread. After :meth:`cancel` the future fails with RequestsCancelled."""
        return self._submit(lambda connections: work(connections.client))

    def submit_plain(self, work: Callable[[PlainConnection], T]) -> Future[T]:
        """:meth:`submit` with the thread's plain connection: for the rows' prefill POSTs (plain_post says why)."""
        return self._submit(lambda connections: work(connections.plain))

    def _submit(self, work: Callable[[_Connections], T]) -> Future[T]:
        future: Future[T] = Future()
        if self._cancelled:
            future.set_exception(RequestsCancelled("the run is stopping: no new requests"))
            return future

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            connections = self._thread_connections()
            with self._lock:
                self._running[future] = connections
            try:
                result = work(connections)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._running.pop(future, None)

        self._threads.submit(run)
        return future

    def call(self, work: Callable[[httpx.Client], T]) -> T:
        """:meth:`submit` and wait for the result."""
        return self.submit(work).result()

    def abort(self, future: Future[Any]) -> None:
        """Give up on one request: not started, it never starts; running, its connection is shut."""
        if future.cancel():
            return
        with self._lock:
            connections = self._running.get(future)
        if connections is not None:
            connections.shutdown()

    def later(self, delay_s: float, callback: Callable[[], object]) -> None:
        """Call ``callback`` (quick, non-blocking) after ``delay_s`` on the timer thread."""
        self._timers.later(delay_s, callback)

    def cancel(self) -> int:
        """Fail every request in flight now and refuse later ones; return how many requests were in flight.
        Every thread's connection is shut, idle keep-alive ones too, but only the requests count: a pool thread
        keeps its connection after its request, so the connections outnumber them (23 at concurrency 16)."""
        with self._lock:
            self._cancelled = True
            connections = list(self._connections)
            in_flight = len(self._running)
        for each in connections:
            each.shutdown()
        return in_flight

    def close(self) -> None:
        self.cancel()
        self._threads.shutdown()
        self._timers.close()
        with self._lock:
            connections = list(self._connections)
        for each in connections:
            each.close()
