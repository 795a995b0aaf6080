"""The request threads' plain connection for the rows' POSTs, against a real HTTP/1.1 server: one connection kept
alive, a connection the server closed while idle replaced without failing a request, a blocked read ended from
another thread at once, and no new connection once the run stops."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from hsextract.extract.requests.plain_post import PlainConnection


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.connections = 0
        self.close_after_answer = False  # the server closes each connection after answering, saying nothing
        self.hang = threading.Event()  # set: /hang never answers until released
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/hang":
            self.server.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Type", self.headers["Content-Type"])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_after_answer:
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def _connection(server: _Server, refuse: Any = lambda: False, keepalive_s: float = 4.0, read_s: float = 30.0) -> PlainConnection:
    return PlainConnection("127.0.0.1", server.server_address[1], 5.0, read_s, keepalive_s, refuse)


def test_posts_go_out_on_one_kept_alive_connection_and_come_back_whole(server: _Server) -> None:
    connection = _connection(server)
    try:
        for i in range(20):
            body = b'{"rid": "r-%d", "input_ids": [%d]}' % (i, i)
            response = connection.post("/generate", body, {"Content-Type": "application/json"})
            assert (response.status_code, response.content) == (200, body)
            assert response.headers["content-type"] == "application/json"
    finally:
        connection.close()
    assert server.connections == 1


def test_an_idle_connection_past_its_keepalive_is_replaced(server: _Server) -> None:
    connection = _connection(server, keepalive_s=0.05)
    try:
        connection.post("/generate", b"1", {"Content-Type": "text/plain"})
        time.sleep(0.1)
        assert connection.post("/generate", b"2", {"Content-Type": "text/plain"}).content == b"2"
    finally:
        connection.close()
    assert server.connections == 2


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(server: _Server) -> None:
    server.close_after_answer = True  # no "Connection: close": the client learns it from the socket
    connection = _connection(server)
    try:
        for i in range(5):
            assert connection.post("/generate", b"%d" % i, {"Content-Type": "text/plain"}).content == b"%d" % i
            time.sleep(0.05)  # the server's close has arrived before the next request
    finally:
        connection.close()
    assert server.connections == 5


def test_shutdown_from_another_thread_ends_a_blocked_read_at_once(server: _Server) -> None:
    connection = _connection(server, read_s=600.0)
    failures: list[BaseException] = []

    def post() -> None:
        try:
            connection.post("/hang", b"x", {"Content-Type": "text/plain"})
        except BaseException as exc:  # what this test looks at
            failures.append(exc)

    thread = threading.Thread(target=post)
    thread.start()
    deadline = time.monotonic() + 5
    while server.connections == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the request is out, its read blocked
    started = time.monotonic()
    assert connection.shutdown()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 5
    assert len(failures) == 1 and isinstance(failures[0], httpx.ReadError)
    server.release.set()
    connection.close()


def test_no_connection_is_made_once_the_run_stops(server: _Server) -> None:
    stopping = threading.Event()
    connection = _connection(server, refuse=stopping.is_set)
    try:
        connection.post("/generate", b"1", {"Content-Type": "text/plain"})
        stopping.set()
        connection.shutdown()  # what ThreadedHTTP.cancel does to every thread's connection
        with pytest.raises(httpx.ConnectError, match="stopping"):
            connection.post("/generate", b"2", {"Content-Type": "text/plain"})
    finally:
        connection.close()
    assert server.connections == 1


def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        connection = PlainConnection("127.0.0.1", port, 5.0, 5.0, 4.0, lambda: False)
        with pytest.raises(httpx.ConnectError):
            connection.post("/generate", b"1", {"Content-Type": "text/plain"})
