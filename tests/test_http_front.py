"""The embedded server's HTTP front (uvicorn + Starlette) over real loopback HTTP.

The engine behind it is a stand-in whose answers the test releases (:class:`HeldEngine`), so that
requests can be kept open across a shutdown; the front itself is the real one. The same front on the
real engine: tests/test_server.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest

from hsextract.capture.front import HttpFront
from hsextract.capture.front.asgi import MAX_BODY_BYTES
from hsextract.capture.stages import StageClock
from hsextract.contract.generate import (
    HEALTH_RID_PREFIX,
    GenerateAnswer,
    GenerateRequest,
    duplicate_rid_message,
    error_body,
)

VOCAB = 1024


class HeldEngine:
    """An engine without a model: health forwards answer at once, ``/generate`` answers when the test says."""

    def __init__(self) -> None:
        self.vocab_size = VOCAB
        self.model_path = Path("/models/stand-in")
        self.clock = StageClock()
        self.hold = False  # True: /generate futures wait in ``held`` for release()
        self.fail_health = False
        self.held: list[tuple[str, list[int], Future[dict[str, Any]]]] = []
        self.shutdown_at: float | None = None
        self._lock = threading.Lock()

    def submit(
        self, rid: str, input_ids: list[int], final_prenorm: bool = False, storage: str | None = None
    ) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        if rid.startswith(HEALTH_RID_PREFIX) and self.fail_health:
            future.set_exception(RuntimeError("device lost"))
        elif rid.startswith("fail-"):
            future.set_exception(RuntimeError("out of memory"))
        elif self.hold and not rid.startswith(HEALTH_RID_PREFIX):
            with self._lock:
                self.held.append((rid, input_ids, future))
        else:
            future.set_result(GenerateAnswer.for_prefill(rid, len(input_ids), time.monotonic()).to_json())
        return future

    def release(self, rid: str) -> None:
        with self._lock:
            for held_rid, ids, future in self.held:
                if held_rid == rid:
                    future.set_result(GenerateAnswer.for_prefill(rid, len(ids), time.monotonic()).to_json())

    def info_json(self) -> dict[str, Any]:
        return {"model_path": str(self.model_path), "vocab_size": self.vocab_size, "engine": "stand-in"}

    def shutdown(self) -> None:
        self.shutdown_at = time.monotonic()


class Front:
    """A real :class:`HttpFront` on a free loopback port, serving in a thread."""

    def __init__(self, **settings: Any) -> None:
        self.engine = HeldEngine()
        self.server = HttpFront(self.engine, "127.0.0.1", 0, **settings)
        self.port = self.server.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-front", daemon=True)
        self.thread.start()


@pytest.fixture
def front() -> Iterator[Any]:
    started: list[Front] = []

    def start(**settings: Any) -> Front:
        started.append(Front(**settings))
        return started[-1]

    yield start
    for each in started:
        each.server.shutdown()


def generate_body(rid: str, ids: list[int]) -> dict[str, Any]:
    return GenerateRequest(rid, ids).to_json()


def test_every_route_answers_like_sglang(front: Any) -> None:
    f = front()
    for path in ("/health", "/health_generate"):
        response = httpx.get(f.url + path)
        assert response.status_code == 200 and response.content == b"", path
    for path in ("/server_info", "/get_server_info"):
        assert httpx.get(f.url + path).json() == f.engine.info_json(), path
    assert httpx.get(f.url + "/get_model_info").json() == {"model_path": "/models/stand-in", "is_generation": True}
    metrics = httpx.get(f.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain") and "hsextract_server_tokens_total" in metrics.text
    answer = httpx.post(f.url + "/generate", json=generate_body("r1", [1, 2, 3]))
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    parsed = GenerateAnswer.parse(answer.json())
    assert parsed is not None and parsed.rid == "r1" and parsed.prompt_tokens == 3
    assert answer.json()["output_ids"] == [] and answer.json()["meta_info"]["completion_tokens"] == 0

    # 400: the contract's message, in SGLang's error body
    for payload in ({"input_ids": [], "sampling_params": {"max_new_tokens": 0}}, {"input_ids": [1, VOCAB]}, [1, 2]):
        response = httpx.post(f.url + "/generate", json=payload)
        with pytest.raises(Exception) as expected:
            GenerateRequest.parse(payload, VOCAB)
        assert response.status_code == 400 and response.json() == error_body(400, str(expected.value)), payload
    not_json = httpx.post(f.url + "/generate", content=b"{nope")
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == 400
    empty = httpx.post(f.url + "/generate", content=b"")
    assert empty.status_code == 400 and "JSON object" in empty.json()["error"]["message"]

    # 404 on any method, 405 on a route asked with the wrong method
    assert httpx.get(f.url + "/nope?x=1").json() == error_body(404, "no route /nope")
    assert httpx.post(f.url + "/health", json={}).status_code == 405
    wrong = httpx.get(f.url + "/generate")
    assert wrong.status_code == 405 and wrong.json() == error_body(405, "method GET not allowed on /generate")
    assert wrong.headers["allow"] == "POST"

    # 500: the forward failed; 503: a health forward failed
    failed = httpx.post(f.url + "/generate", json=generate_body("fail-1", [1]))
    assert failed.json() == error_body(500, "forward failed for fail-1: RuntimeError: out of memory")
    f.engine.fail_health = True
    unhealthy = httpx.get(f.url + "/health_generate")
    assert unhealthy.json() == error_body(503, "health forward failed: RuntimeError: device lost")
    assert unhealthy.status_code == 503


def test_a_rid_is_refused_like_sglang_while_the_engine_holds_an_earlier_request_of_it(front: Any) -> None:
    """Two requests of one rid would write one dump directory at once. SGLang refuses the second
    (400 "Duplicate request ID detected") until the first is finished or aborted; so does this server,
    until the engine has finished the first, whether or not its client is still connected."""
    f = front()
    f.engine.hold = True
    gave_up: list[bool] = []

    def post_and_give_up() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f.url + "/generate", json=generate_body("dup", [1, 2]), timeout=0.5)
        gave_up.append(True)

    first = threading.Thread(target=post_and_give_up)
    first.start()
    deadline = time.monotonic() + 10
    while not f.engine.held:
        assert time.monotonic() < deadline, "the first request never reached the engine"
        time.sleep(0.02)
    first.join()
    assert gave_up, "the first client gave up (read timeout); the engine still holds its request"
    again = httpx.post(f.url + "/generate", json=generate_body("dup", [1, 2]))
    assert again.status_code == 400 and again.json() == error_body(400, duplicate_rid_message("dup"))
    f.engine.hold = False
    f.engine.release("dup")
    assert httpx.post(f.url + "/generate", json=generate_body("dup", [1, 2])).status_code == 200


def test_a_batch_of_prompts_is_answered_in_order_once_its_last_is_done(front: Any) -> None:
    """SGLang's batched form (lists of input_ids and rids): one answer a prompt, in order, once every prompt's
    dump is written; a rid of it the engine still holds refuses the whole body and holds none of the others."""
    f = front()
    f.engine.hold = True
    body = GenerateRequest.batch_json([GenerateRequest("b0", [1, 2]), GenerateRequest("b1", [3]), GenerateRequest("b2", [4, 5])])
    answered: list[httpx.Response] = []
    posting = threading.Thread(target=lambda: answered.append(httpx.post(f.url + "/generate", json=body, timeout=10)))
    posting.start()
    deadline = time.monotonic() + 10
    while len(f.engine.held) < 3:
        assert time.monotonic() < deadline, "the batch never reached the engine"
        time.sleep(0.02)
    f.engine.release("b2")
    f.engine.release("b0")
    time.sleep(0.2)
    assert not answered, "answered before its last prompt was done"
    again = GenerateRequest.batch_json([GenerateRequest("new", [1]), GenerateRequest("b1", [1])])
    refused = httpx.post(f.url + "/generate", json=again)
    assert refused.status_code == 400 and refused.json() == error_body(400, duplicate_rid_message("b1"))
    f.engine.release("b1")
    posting.join(10)
    answers = answered[0].json()
    assert [(a["meta_info"]["id"], a["meta_info"]["prompt_tokens"]) for a in answers] == [("b0", 2), ("b1", 1), ("b2", 2)]
    f.engine.hold = False
    assert httpx.post(f.url + "/generate", json=again).status_code == 200  # "new" was let go with the refusal


def test_keep_alive_serves_many_requests_on_one_connection(front: Any) -> None:
    f = front()
    conn = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10)
    ends = set()
    for i in range(6):
        if i % 2:
            conn.request("GET", "/health")
        else:
            conn.request(
                "POST", "/generate", body=json.dumps(generate_body(f"k{i}", [1, 2])), headers={"Content-Type": "application/json"}
            )
        response = conn.getresponse()
        response.read()
        assert response.status == 200 and response.getheader("connection") != "close"
        assert conn.sock is not None
        ends.add(conn.sock.getsockname())
    assert len(ends) == 1  # http.client reconnects when the server closes: one local end means one connection
    conn.close()


def test_a_body_over_the_bound_gets_413_and_the_server_keeps_serving(front: Any) -> None:
    f = front()
    # declared larger than the default bound: refused from the header, before any byte of the body
    conn = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10)
    conn.putrequest("POST", "/generate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and response.getheader("connection") == "close"
    message = json.loads(response.read())["error"]["message"]
    assert json.loads(json.dumps(error_body(413, message))) == {"error": {"message": message, "code": 413}}
    assert f"{MAX_BODY_BYTES + 1} bytes" in message and str(MAX_BODY_BYTES) in message
    conn.close()

    small = front(max_body_bytes=4096)
    padded = json.dumps(generate_body("fits", [1, 2, 3])).encode()
    padded += b" " * (4096 - len(padded))
    assert httpx.post(small.url + "/generate", content=padded).status_code == 200  # exactly at the bound
    over = httpx.post(small.url + "/generate", content=padded + b" ")
    assert over.status_code == 413 and over.json()["error"]["code"] == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it is read
        for _ in range(4):
            yield b" " * 2048

    chunked = httpx.post(small.url + "/generate", content=chunks())
    assert chunked.status_code == 413 and "4096" in chunked.json()["error"]["message"]
    assert httpx.post(small.url + "/generate", json=generate_body("after", [5])).status_code == 200
    assert httpx.get(small.url + "/health").status_code == 200


def test_shutdown_answers_every_open_request_then_stops_the_engine(front: Any) -> None:
    f = front(grace_s=1.5)
    f.engine.hold = True
    answers: dict[str, tuple[int, dict[str, Any]]] = {}

    def post(rid: str) -> None:
        response = httpx.post(f.url + "/generate", json=generate_body(rid, [1, 2, 3]), timeout=30)
        answers[rid] = (response.status_code, response.json())  # a cut connection raises instead

    clients = [threading.Thread(target=post, args=(f"open-{i}",)) for i in range(3)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 10
    while len(f.engine.held) < 3:
        assert time.monotonic() < deadline, "the requests never reached the engine"
        time.sleep(0.02)
    idle = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10)  # an idle keep-alive connection
    idle.request("GET", "/health")
    idle.getresponse().read()

    began = time.monotonic()
    stopper = threading.Thread(target=f.server.shutdown)
    stopper.start()
    time.sleep(0.5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", f.port), timeout=2)
    f.engine.release("open-0")  # finishes within the grace: answered normally
    for client in clients:
        client.join(timeout=20)
    stopper.join(timeout=20)
    assert not stopper.is_alive()

    assert answers["open-0"][0] == 200 and answers["open-0"][1]["meta_info"]["id"] == "open-0"
    for rid in ("open-1", "open-2"):
        status, body = answers[rid]
        assert status == 503 and body["error"]["code"] == 503, body
        assert body["error"]["message"].startswith(f"server shutting down: request {rid} was not finished within the 1.5 s")
    assert f.engine.shutdown_at is not None and f.engine.shutdown_at - began >= 1.5  # after the grace, not before
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        idle.request("GET", "/health")
        idle.getresponse()
    f.server.shutdown()  # twice is harmless


def test_shutdown_with_nothing_open_is_prompt(front: Any) -> None:
    f = front()  # the default 30 s grace
    assert httpx.get(f.url + "/health").status_code == 200
    began = time.monotonic()
    f.server.shutdown()
    assert time.monotonic() - began < 2 and f.engine.shutdown_at is not None
    f.thread.join(timeout=5)
    assert not f.thread.is_alive()


def test_a_server_shut_down_before_it_served_releases_its_port() -> None:
    engine = HeldEngine()
    server = HttpFront(engine, "127.0.0.1", 0)
    port = server.port
    server.shutdown()
    server.serve_forever()  # returns at once
    assert engine.shutdown_at is not None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_port_in_use_fails_at_construction() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as failed:
            HttpFront(HeldEngine(), "127.0.0.1", taken.getsockname()[1])
    assert failed.value.strerror == "Address already in use"  # what hsextract serve's ConfigError names
