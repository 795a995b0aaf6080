"""The stall of issue 16, replayed: requests whose answers never arrived although the server sent them.

The extractor's worker threads used to share one httpcore connection pool. That pool closes
connections it takes for idle or expired from whichever thread runs it next, while another thread
may just have been handed one and sent its request on it: that request fails with EBADF, goes out
on a stranger's connection, or (once the descriptor is reused) waits on the wrong socket until its
read timeout. Here many threads send many small requests through the real client to a real HTTP
server, with connections expiring between requests (20 ms, as idle connections do at the end of a
run or when more are open than kept alive) and a tiny GIL switch interval to interleave threads
finely. Before the fix this lost answers (timeouts), failed requests with ``Bad file descriptor``
and delivered truncated bodies to the server; now every request is answered, whole, once.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hsextract.contract.generate import GenerateAnswer, GenerateRequest
from hsextract.extract.requests.client import ServerClient

THREADS, REQUESTS_EACH = 96, 30


class _Counting(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[str] = []
        self.malformed = 0
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Counting

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            request = GenerateRequest.parse(json.loads(raw), vocab_size=10)
        except ValueError:
            with self.server.lock:
                self.server.malformed += 1
            self.close_connection = True
            return
        with self.server.lock:
            self.server.received.append(request.rid)
        time.sleep(random.random() * 0.01)
        body = json.dumps(GenerateAnswer(request.rid, len(request.input_ids)).to_json()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[_Counting]:
    httpd = _Counting()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def fine_thread_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def test_every_answer_arrives_while_connections_expire_between_requests(server: _Counting, fine_thread_switching: None) -> None:
    client = ServerClient(f"http://127.0.0.1:{server.server_address[1]}", request_timeout_s=15.0, keepalive_expiry_s=0.02)
    failures: list[str] = []
    answered: list[str] = []
    lock = threading.Lock()

    def work(thread: int) -> None:
        for i in range(REQUESTS_EACH):
            rid = f"t{thread}-{i}"
            try:
                pending = client.send_prefill(GenerateRequest(rid, [1, 2, 3]))  # as RowWorker sends
                pending.wait(None)
                answer = pending.result()
            except Exception as exc:  # every failure is what this test counts
                with lock:
                    failures.append(f"{rid}: {exc!r}")
            else:
                with lock:
                    answered.append(answer.rid or "")
            time.sleep(random.random() * 0.02)  # idle long enough for the connection to expire

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        client.close()
    assert failures == [], f"{len(failures)} requests failed or lost their answer, e.g. {failures[:3]}"
    assert server.malformed == 0, "requests reached the server truncated or on another request's connection"
    sent = sorted(f"t{t}-{i}" for t in range(THREADS) for i in range(REQUESTS_EACH))
    assert sorted(answered) == sorted(server.received) == sent


def test_cancel_wakes_a_request_the_server_never_answers() -> None:
    """A hung server: cancel() ends the blocked request at once and refuses new ones."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections (the kernel does) and never answers
    client = ServerClient(f"http://127.0.0.1:{listener.getsockname()[1]}", request_timeout_s=600.0)
    try:
        pending = client.send_prefill(GenerateRequest("hung", [1]))
        assert not pending.wait(0.5)
        started = time.monotonic()
        assert client.cancel() >= 1
        assert pending.wait(5.0)
        assert time.monotonic() - started < 5.0
        with pytest.raises(Exception, match="hung"):
            pending.result()
        refused = client.send_prefill(GenerateRequest("after", [1]))
        assert refused.wait(1.0)
        with pytest.raises(Exception, match="after"):
            refused.result()
    finally:
        client.close()
        listener.close()
