"""Ctrl-C's count of what it cancelled (issue 29 item 14: "cancelled 23 open connections" at concurrency 16): the
requests in flight, not every pool thread's kept-alive connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from hsextract.extract.requests.http_threads import RequestsCancelled, ThreadedHTTP

RELEASE = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: each pool thread keeps its connection open after its request

    def do_GET(self) -> None:
        if self.path == "/hang":
            RELEASE.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    RELEASE.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    RELEASE.set()
    httpd.shutdown()


def test_cancel_counts_the_requests_in_flight_not_the_idle_connections(server: str) -> None:
    http = ThreadedHTTP(server, httpx.Timeout(30.0), max_threads=32)
    try:
        barrier = threading.Barrier(24)

        def fast(client: httpx.Client) -> int:
            barrier.wait(10)  # 24 threads at once: 24 kept-alive connections afterwards
            return client.get("/fast").status_code

        assert [f.result(10) for f in [http.submit(fast) for _ in range(24)]] == [200] * 24
        hanging: list[Future[int]] = [http.submit(lambda c: c.get("/hang").status_code) for _ in range(16)]
        deadline = time.monotonic() + 10
        while len(http._running) < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert http.cancel() == 16
        for future in hanging:
            with pytest.raises((httpx.TransportError, RequestsCancelled)):
                future.result(10)
    finally:
        RELEASE.set()
        http.close()
