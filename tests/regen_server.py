"""A small real HTTP server answering SGLang 0.5.23's /generate decode shapes, for the client side of
``hsextract regenerate`` (retries, refusals, resume, accounting). Its "model" is a hash of the prompt:
the equality tests against a real model use the embedded server instead."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: ids the fake answers are drawn from: ordinary byte-level BPE tokens of the tiny tokenizers
ANSWER_IDS = range(300, 900)


def fake_answer(input_ids: list[int], params: dict[str, Any]) -> tuple[list[int], str]:
    """Output ids (with the first stop id when it stops) and the finish reason, from the prompt alone
    (and the seed when sampling)."""
    key = json.dumps([input_ids, params.get("sampling_seed") if params.get("temperature", 1.0) > 0 else None])
    digest = hashlib.sha256(key.encode()).digest()
    length = 2 + digest[0] % 6
    ids = [ANSWER_IDS[b % len(ANSWER_IDS)] for b in digest[1 : 1 + length]]
    limit = int(params["max_new_tokens"])
    stops = params.get("stop_token_ids") or []
    if len(ids) >= limit:
        return ids[:limit], "length"
    return ids + stops[:1], "stop"


@dataclass
class FakeSGLang:
    model_path: str
    delay_s: float = 0.0
    fail_first: int = 0  # answer this many /generate requests with HTTP 503 first (the run's 1-token probe aside)
    prefill_only: bool = False  # refuse decoding as the embedded server without generation does
    refuse_longer_than: int | None = None  # prompts longer: HTTP 400 as SGLang's context-length check
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path in ("/health", "/health_generate"):
                    self._send(200, {})
                elif self.path in ("/server_info", "/get_model_info"):
                    self._send(200, {"model_path": fake.model_path})
                else:
                    self._send(404, {"error": {"message": "not found", "code": 404}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                status, answer = fake.answer(body)
                self._send(status, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(body)
            failing = self.fail_first > 0 and "-probe-" not in body["rid"]
            if failing:
                self.fail_first -= 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if failing:
            return 503, {"error": {"message": "overloaded", "code": 503}}
        ids = body["input_ids"]
        if self.prefill_only and body["sampling_params"].get("max_new_tokens", 0) != 0:
            message = "this server only prefills: set sampling_params.max_new_tokens to 0"
            return 400, {"error": {"message": message, "code": 400}}
        if self.refuse_longer_than is not None and len(ids) > self.refuse_longer_than:
            message = f"The input ({len(ids)} tokens) is longer than the model's context length ({self.refuse_longer_than})"
            return 400, {"error": {"message": message, "code": 400}}
        output, reason = fake_answer(ids, body["sampling_params"])
        finish = {"type": "stop", "matched": output[-1]} if reason == "stop" else {"type": "length", "length": len(output)}
        meta = {"id": body["rid"], "finish_reason": finish, "prompt_tokens": len(ids), "completion_tokens": len(output)}
        return 200, {"output_ids": output, "meta_info": meta}

    def stop(self) -> None:
        if not getattr(self, "_stopped", False):
            self._stopped = True
            self.server.shutdown()
            self.server.server_close()


def write_rows(path: Path, rows: list[Any]) -> Path:
    """A JSONL file of these rows (a str is written as the line itself: bad JSON on purpose)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n" for row in rows),
                    encoding="utf-8")
    return path
