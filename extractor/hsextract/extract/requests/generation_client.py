"""A small ``/generate`` client for decoding requests (``max_new_tokens > 0``), SGLang's or the embedded server's.

One POST carries one :class:`~hsextract.contract.generate.GenerationRequest` or, batched, several (SGLang's
list form); the answers come back in request order. A 400 raises :class:`BadSampleError` with the server's
message (a prompt past the context names its rid), any other failure :class:`TransientServerError`.
The resumable, observable ``hsextract regenerate`` builds on these types, not necessarily on this function.
"""

from __future__ import annotations

import httpx

from hsextract.contract.generate import GENERATE_PATH, GenerationAnswer, GenerationRequest, error_message
from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError, TransientServerError, WrongServerError


def generate(
    base_url: str, requests: list[GenerationRequest], timeout_s: float = 3600.0, client: httpx.Client | None = None
) -> list[GenerationAnswer]:
    """The answers to ``requests`` (one POST), in their order."""
    if not requests:
        return []
    body = requests[0].to_json() if len(requests) == 1 else GenerationRequest.batch_json(requests)
    url = base_url.rstrip("/") + GENERATE_PATH
    try:
        response = (client or httpx).post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TransientServerError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
    try:
        decoded = response.json()
    except ValueError:
        decoded = None
    if response.status_code == 400:
        message = error_message(decoded) or response.text[:200]
        raise BadSampleError(ErrorReason.SERVER_REJECTED, f"{url} refused {requests[0].rid}: {message}")
    if response.status_code != 200:
        raise TransientServerError(f"POST {url} answered HTTP {response.status_code}: {response.text[:200]!r}")
    answers = GenerationAnswer.parse_list(decoded)
    if answers is None or [a.rid for a in answers] != [r.rid for r in requests]:
        raise WrongServerError(
            f"POST {url} answered no generation answer for {[r.rid for r in requests]}: {response.text[:200]!r}"
        )
    return answers
