"""The HTTP front's routes as an ASGI app (Starlette): the subset of SGLang's API the extractor uses,
served for any :class:`~hsextract.capture.front.protocol.ServedEngine`.

``POST /generate`` (:class:`~hsextract.contract.generate.GenerateRequest`; with ``return_hidden_states``
the engine's own states, :mod:`~hsextract.capture.front.spot_check_route`), ``GET /health`` and
``/health_generate`` (200 only when a real forward works, 503 otherwise), ``GET /server_info``
(also ``/get_server_info``), ``GET /get_model_info`` and ``GET /metrics`` (Prometheus: the capture
stages, :mod:`hsextract.capture.stages`). A ``/generate`` is answered once its dump is written.
Errors answer like SGLang, ``{"error": {"message": ..., "code": status}}``:

- 400 a body that is not a valid request (the message names what is wrong), or SGLang's
  "Duplicate request ID detected: <rid>" for a rid whose earlier request the engine has not
  finished (the two would write one dump directory);
- 404 no such route, 405 a route asked with the wrong method;
- 413 a body longer than ``max_body_bytes`` (refused from its ``Content-Length`` before it is read;
  a chunked body as soon as it passes the limit); the connection is then closed;
- 500 the forward failed, or its dump could not be written (the message says why); 503 a health
  forward failed, a request timed out, or the server is shutting down and the request was still open
  when the grace period ended (:class:`Drain`).

The engine's answers are :class:`concurrent.futures.Future`; the handlers await them through
:meth:`Drain.wait` (a loop future the answer wakes), so the event loop never blocks on a forward.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hsextract.capture.front.drain import Drain, ShuttingDown
from hsextract.capture.front.generate_route import answer_generation
from hsextract.capture.front.protocol import ServedEngine
from hsextract.capture.front.rids_in_flight import RidsInFlight
from hsextract.capture.front.spot_check_route import answer_spot_check
from hsextract.contract.generate import (
    GENERATE_PATH,
    HEALTH_GENERATE_PATH,
    HEALTH_PATH,
    HEALTH_RID_PREFIX,
    METRICS_PATH,
    MODEL_INFO_PATH,
    SERVER_INFO_PATHS,
    GenerateRequest,
    duplicate_rid_message,
    error_body,
    wants_decoding,
)
from hsextract.contract.spot_check import is_spot_check
from hsextract.errors import BadRequestError, DumpError

log = logging.getLogger(__name__)

T = TypeVar("T")

HEALTH_TIMEOUT_S = 20.0
GENERATE_TIMEOUT_S = 3600.0
#: Largest request body accepted. The longest prompt is a JSON list of token ids, at most about
#: 8 bytes a token (6 digits, comma, space): 64 MiB holds 8 M tokens, 8x a 1 M-token context.
MAX_BODY_BYTES = 64 * 1024 * 1024


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


class _Routes:
    def __init__(self, engine: ServedEngine, drain: Drain, max_body_bytes: int) -> None:
        self.engine = engine
        self.drain = drain
        self.max_body_bytes = max_body_bytes
        self.rids = RidsInFlight()

    async def generate(self, request: Request) -> Response:
        try:
            data = await self._body(request)
        except _TooLarge as exc:
            # Connection: close, or the unread rest of the body would be taken for the next request.
            return _error(413, str(exc), headers={"Connection": "close"})
        except ClientDisconnect:
            return Response(status_code=400)  # the client left in the middle of its body: nobody reads this
        try:
            body = json.loads(data or b"null")
            if is_spot_check(body):  # the engine's own hidden states, not dumped (spot_check_route.py)
                accept = request.headers.get("accept", "")
                return await answer_spot_check(self.engine, body, self.drain, GENERATE_TIMEOUT_S, accept)
            if wants_decoding(body):  # max_new_tokens > 0: the decode scheduler (generate_route.py)
                return await answer_generation(self.engine, body, self.drain, self.rids, GENERATE_TIMEOUT_S)
            parsed, batched = GenerateRequest.parse_batch(body, self.engine.vocab_size)
        except (ValueError, BadRequestError) as exc:  # ValueError: not JSON, not UTF-8
            return _error(400, str(exc))
        duplicate = self.rids.take([prompt.rid for prompt in parsed])
        if duplicate is not None:
            return _error(400, duplicate_rid_message(duplicate))
        futures = []
        for prompt in parsed:
            future = self.engine.submit(prompt.rid, prompt.input_ids, prompt.final_prenorm, prompt.storage)
            self.rids.release_when_done(prompt.rid, future)
            futures.append(future)

        def unfinished() -> str:
            return ", ".join(prompt.rid for prompt, future in zip(parsed, futures, strict=True) if not future.done())

        try:
            await self.drain.wait(_all_done(futures), GENERATE_TIMEOUT_S)
        except ShuttingDown:
            return _error(
                503,
                f"server shutting down: request {unfinished()} was not finished within the {self.drain.grace_s:g} s "
                "grace period; send it again to a running server",
            )
        except TimeoutError:
            return _error(503, f"request {unfinished()} timed out in the embedded server")
        answers = []
        for prompt, future in zip(parsed, futures, strict=True):
            try:
                answers.append(future.result())
            except DumpError as exc:
                return _error(500, f"the forward of {prompt.rid} ran, its dump failed: {exc}")
            except Exception as exc:
                return _error(500, f"forward failed for {prompt.rid}: {type(exc).__name__}: {exc}")
        return JSONResponse(answers if batched else answers[0])

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _TooLarge(int(declared), self.max_body_bytes)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge(size, self.max_body_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    async def health(self, request: Request) -> Response:
        started = time.monotonic()
        future = self.engine.submit(f"{HEALTH_RID_PREFIX}{uuid.uuid4().hex}", [0])
        try:
            await self.drain.wait(future, HEALTH_TIMEOUT_S)
        except ShuttingDown:
            return _error(503, "server shutting down")
        except Exception as exc:
            return _error(503, f"health forward failed: {type(exc).__name__}: {exc}")
        log.debug("health forward took %.3f s", time.monotonic() - started)
        return Response(status_code=200)

    async def server_info(self, request: Request) -> Response:
        return JSONResponse(self.engine.info_json())

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": str(self.engine.model_path), "is_generation": True})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.engine.clock.registry), media_type=CONTENT_TYPE_LATEST)


def _all_done(futures: list[Future[T]]) -> Future[None]:
    """A future resolved (never failed) once every one of ``futures`` is: one wake-up of the serving loop for a
    batch; each answer or failure is then read from its own future."""
    done: Future[None] = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[T]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            done.set_result(None)

    for future in futures:
        future.add_done_callback(one_done)
    return done


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"request body of {size} bytes is larger than the server's limit of {limit} bytes; "
            "send fewer or shorter prompts per request"
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"method {request.method} not allowed on {request.url.path}"
    elif exc.status_code == 404:
        message = f"no route {request.url.path}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error(500, f"{request.url.path} failed: {type(exc).__name__}: {exc}")


def build_app(engine: ServedEngine, drain: Drain, max_body_bytes: int = MAX_BODY_BYTES) -> Starlette:
    """The ASGI app serving ``engine``; ``drain`` ends its open requests at shutdown."""
    routes = _Routes(engine, drain, max_body_bytes)
    table = [
        Route(GENERATE_PATH, routes.generate, methods=["POST"]),
        Route(HEALTH_PATH, routes.health, methods=["GET"]),
        Route(HEALTH_GENERATE_PATH, routes.health, methods=["GET"]),
        *(Route(path, routes.server_info, methods=["GET"]) for path in SERVER_INFO_PATHS),
        Route(MODEL_INFO_PATH, routes.model_info, methods=["GET"]),
        Route(METRICS_PATH, routes.metrics, methods=["GET"]),
    ]
    return Starlette(routes=table, exception_handlers={HTTPException: _http_error, Exception: _server_error})
