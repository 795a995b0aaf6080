"""The start-up health wait: a server still starting is waited for, another program on the port is not."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hsextract.errors import ServerError, WrongServerError
from hsextract.extract.requests.client import ServerClient

#: status, body, content type
Answer = tuple[int, bytes, str]
HTML = b"<!DOCTYPE html><html><body><h1>Directory listing</h1></body></html>"


class PlainServer:
    """A real HTTP server (http.server) answering every GET with the next of ``answers`` (the last one repeats)."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, content_type = outer.answers[min(outer.calls, len(outer.answers) - 1)]
                outer.calls += 1
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def plain_server() -> Iterator[Callable[[list[Answer]], PlainServer]]:
    started: list[PlainServer] = []

    def start(answers: list[Answer]) -> PlainServer:
        started.append(PlainServer(answers))
        return started[-1]

    yield start
    for server in started:
        server.close()


@pytest.mark.parametrize(
    ("answer", "path"),
    [
        ((404, HTML, "text/html"), ""),  # a plain web server on the port
        ((404, b'{"detail": "Not Found"}', "application/json"), "/generate"),  # --server ending in /generate
        ((401, b"auth required", "text/plain"), ""),
    ],
    ids=["404-html", "url-ends-in-generate", "401"],
)
def test_another_program_on_the_port_fails_at_once(plain_server, answer: tuple[int, bytes, str], path: str) -> None:
    server = plain_server([answer])
    client = ServerClient(server.url + path)
    started = time.monotonic()
    try:
        with pytest.raises(WrongServerError) as caught:
            client.wait_until_healthy(60)
    finally:
        client.close()
    assert time.monotonic() - started < 10, "polled as if the server were still starting"
    assert server.calls == 1
    message = str(caught.value)
    assert f"GET {server.url}{path}/health_generate answered HTTP {answer[0]}" in message
    assert "not an SGLang or hsextract server" in message and "check --server" in message


def test_a_starting_server_is_still_waited_for(plain_server) -> None:
    # 503 while the weights load, then 200: the wait goes on through the 503s
    loading = (503, b'{"error": {"message": "model weights still loading"}}', "application/json")
    server = plain_server([loading, loading, (200, b"", "text/plain")])
    client = ServerClient(server.url)
    try:
        client.wait_until_healthy(30)
    finally:
        client.close()
    assert server.calls == 3


def test_refused_connections_are_waited_for_until_the_timeout(plain_server) -> None:
    server = plain_server([(200, b"", "text/plain")])
    url = server.url
    server.close()  # nothing listens there any more: connection refused, as before a server binds its port
    client = ServerClient(url)
    try:
        with pytest.raises(ServerError, match="did not answer HTTP 200 on /health_generate within 1 s") as caught:
            client.wait_until_healthy(1)
    finally:
        client.close()
    assert not isinstance(caught.value, WrongServerError)
