"""HTTP front of the embedded server: the subset of SGLang's API the extractor uses.

``POST /generate`` ({input_ids, rid, sampling_params: {max_new_tokens: 0}}), ``GET /health`` and
``/health_generate`` (200 only when a real forward works, 503 otherwise), ``GET /server_info``
(also ``/get_server_info``), ``GET /get_model_info`` and ``GET /metrics`` (Prometheus: the capture
stages, :mod:`hsextract.capture.stages`). ``/generate`` also takes ``hsextract_final_prenorm: true``
to dump that request's pre-norm final state (only the ``speculators`` format needs it). A request is
answered once its dump is written. Errors answer like SGLang:
``{"error": {"message": ...}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hsextract.capture.embedded.engine import Engine
from hsextract.contract.server_info import FINAL_PRENORM_KEY
from hsextract.errors import BadRequestError

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 20.0
GENERATE_TIMEOUT_S = 3600.0


class EmbeddedServer:
    """Serve an :class:`Engine` over HTTP until :meth:`shutdown`."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        handler = type("Handler", (_Handler,), {"engine": engine})
        self.httpd = _HTTPServer((host, port), handler)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.shutdown()


class _HTTPServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024  # an extractor opens --concurrency connections at once


class _Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave as two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:  # route access logs to logging
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "code": status}})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._health()
        elif path in ("/server_info", "/get_server_info"):
            self._send(200, self.engine.info_json())
        elif path == "/metrics":
            self._metrics()
        elif path == "/get_model_info":
            self._send(200, {"model_path": str(self.engine.model_path), "is_generation": True})
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/generate":
            self._error(404, f"no route {path}")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            rid, input_ids, final_prenorm = self._parse_generate(body)
        except (ValueError, BadRequestError) as exc:
            self._error(400, str(exc))
            return
        future = self.engine.submit(rid, input_ids, final_prenorm=final_prenorm)
        try:
            self._send(200, future.result(timeout=GENERATE_TIMEOUT_S))
        except FutureTimeout:
            self._error(503, f"request {rid} timed out in the embedded server")
        except Exception as exc:
            self._error(500, f"forward failed for {rid}: {type(exc).__name__}: {exc}")

    def _parse_generate(self, body: Any) -> tuple[str, list[int], bool]:
        if not isinstance(body, dict):
            raise BadRequestError("not_an_object", "request body must be a JSON object")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids:
            raise BadRequestError("no_input_ids", "input_ids must be a non-empty list of token ids (this server takes no text)")
        if any(type(i) is not int for i in ids):
            raise BadRequestError("non_integer_ids", "input_ids must hold integers only (one prompt per request)")
        vocab = self.engine.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise BadRequestError("out_of_vocab", f"input_ids must lie in [0, {vocab}): got {min(ids)}..{max(ids)}")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict) or params.get("max_new_tokens", 0) != 0:
            raise BadRequestError("decode_requested", "this server only prefills: set sampling_params.max_new_tokens to 0")
        rid = body.get("rid")
        if rid is None:
            rid = uuid.uuid4().hex
        if not isinstance(rid, str):
            raise BadRequestError("bad_rid", "rid must be a string")
        final_prenorm = body.get(FINAL_PRENORM_KEY, False)
        if not isinstance(final_prenorm, bool):
            raise BadRequestError("bad_final_prenorm", f"{FINAL_PRENORM_KEY} must be true or false")
        return rid, ids, final_prenorm

    def _metrics(self) -> None:
        data = generate_latest(self.engine.clock.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _health(self) -> None:
        started = time.monotonic()
        future = self.engine.submit(f"HEALTH_CHECK_{uuid.uuid4().hex}", [0])
        try:
            future.result(timeout=HEALTH_TIMEOUT_S)
        except Exception as exc:
            self._error(503, f"health forward failed: {type(exc).__name__}: {exc}")
            return
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        log.debug("health forward took %.3f s", time.monotonic() - started)
