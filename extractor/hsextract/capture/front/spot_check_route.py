"""``POST /generate`` with ``return_hidden_states: true``: the engine's own hidden states of one prompt,
answered in ``meta_info.hidden_states`` as SGLang does (:mod:`hsextract.contract.spot_check`). Never
dumped; 400 names what is wrong, 500 a failed forward, 503 a timeout or a shutdown. The answer (tens of
MB of floats) is encoded on a worker thread: on the event loop it held every other request for a
second per check on the H200 (the default check cost 45 % of an 8B-shaped run's rate)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from starlette.responses import JSONResponse, Response

from hsextract.capture.front.drain import Drain, ShuttingDown
from hsextract.contract.generate import error_body
from hsextract.contract.spot_check import STATES_MEDIA_TYPE, SpotCheckAnswer, SpotCheckRequest
from hsextract.errors import BadRequestError


@runtime_checkable
class SpotCheckingEngine(Protocol):
    vocab_size: int

    def spot_check(self, rid: str, input_ids: list[int]) -> Future[SpotCheckAnswer]: ...


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


async def answer_spot_check(engine: object, body: Any, drain: Drain, timeout_s: float, accept: str = "") -> Response:
    """The response to a ``return_hidden_states`` body; binary when ``accept`` (the request's header) names it."""
    if not isinstance(engine, SpotCheckingEngine):
        return _error(400, "this server does not return hidden states: leave return_hidden_states out")
    try:
        request = SpotCheckRequest.parse(body, engine.vocab_size)
    except BadRequestError as exc:
        return _error(400, str(exc))
    future = engine.spot_check(request.rid, request.input_ids)
    try:
        answer: SpotCheckAnswer = await drain.wait(future, timeout_s)
    except TimeoutError:
        return _error(503, f"request {request.rid} timed out in the embedded server")
    except ShuttingDown:
        return _error(503, f"server shutting down: request {request.rid} was not finished; send it again")
    except Exception as exc:
        return _error(500, f"forward failed for {request.rid}: {type(exc).__name__}: {exc}")
    if STATES_MEDIA_TYPE in accept:
        return Response(answer.to_states_bytes(), media_type=STATES_MEDIA_TYPE)
    body = await asyncio.to_thread(answer.to_json_bytes, len(request.input_ids))
    return Response(body, media_type="application/json")
