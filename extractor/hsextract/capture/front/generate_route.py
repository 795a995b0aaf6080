"""``POST /generate`` with ``max_new_tokens > 0``: parse, hand to the engine's decode scheduler, answer.

The answer is SGLang's under ``--skip-tokenizer-init``: one object per prompt (a list for a batched
body), ``output_ids`` and ``meta_info`` (``id``, ``finish_reason``, ``prompt_tokens``,
``completion_tokens``, ``cached_tokens``, ``e2e_latency``). 400 names what is wrong (a prompt past the
context: its rid), 500 a failed forward, 503 a timeout or a shutdown.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from starlette.responses import JSONResponse, Response

from hsextract.capture.front.drain import Drain, ShuttingDown
from hsextract.capture.front.rids_in_flight import RidsInFlight
from hsextract.contract.generate import GenerationAnswer, GenerationRequest, duplicate_rid_message, error_body
from hsextract.errors import BadRequestError


@runtime_checkable
class GeneratingEngine(Protocol):
    vocab_size: int

    def generate(self, requests: list[GenerationRequest]) -> list[Future[GenerationAnswer]]: ...


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


async def answer_generation(engine: object, body: Any, drain: Drain, rids: RidsInFlight, timeout_s: float) -> Response:
    """The response to a decoding ``/generate`` body; ``rids`` keeps its rids unique while it runs."""
    if not isinstance(engine, GeneratingEngine):
        return _error(400, "this server does not decode: send sampling_params.max_new_tokens 0")
    try:
        requests, batched = GenerationRequest.parse_batch(body, engine.vocab_size)
    except BadRequestError as exc:
        return _error(400, str(exc))
    held = [request.rid for request in requests]
    duplicate = rids.take(held)
    if duplicate is not None:
        return _error(400, duplicate_rid_message(duplicate))
    try:
        futures = engine.generate(requests)
    except BadRequestError as exc:
        rids.release(held)
        return _error(400, str(exc))
    for rid, future in zip(held, futures, strict=True):
        rids.release_when_done(rid, future)
    answers: list[dict[str, Any]] = []
    for request, future in zip(requests, futures, strict=True):
        try:
            answer: GenerationAnswer = await drain.wait(future, timeout_s)
        except TimeoutError:
            return _error(503, f"request {request.rid} timed out in the embedded server")
        except ShuttingDown:
            return _error(503, f"server shutting down: request {request.rid} was not finished; send it again")
        except Exception as exc:
            return _error(500, f"decode failed for {request.rid}: {type(exc).__name__}: {exc}")
        answers.append(answer.to_json())
    return JSONResponse(answers if batched else answers[0])
