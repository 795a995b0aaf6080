"""``POST /generate`` with decoding, as SGLang 0.5.23 takes it, and the server's identity.

The shapes are ``contract/generate.py``'s ``GenerationRequest`` / ``SamplingParams`` / ``GenerationAnswer``,
which the embedded server parses and answers too. Request (SGLang's ``GenerateReqInput``; ``SamplingParams``
in ``sglang/srt/sampling/sampling_params.py``)::

    {"input_ids": [...], "rid": "regen-...", "sampling_params": {"max_new_tokens": N, "temperature": T,
     "top_p": P, "top_k": K, "stop_token_ids": [...], "sampling_seed": S?}}

Answer: ``{"output_ids": [...], "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", ...},
"completion_tokens": n, ...}}``; SGLang's ``output_ids`` include the matched stop token.

Rids are ``regen-<run>-<row>-<turn>-<attempt>``: not the extraction form ``<prefix>-<9 digits>-n<tokens>``
(``contract/rids.py``), so an extraction server's dump hook never dumps them, and a new one per try, so
a retry never meets the server still holding the request it replaces (SGLang's "Duplicate request ID").

Answers are classified as the extractor's client does (``extract/requests/client.py``): no connection ->
:class:`ServerUnreachableError` (the run waits for the server); 408, 429, 5xx, a timeout, a dropped
connection, a duplicate rid or an abort without a 400 -> :class:`TransientServerError` (retried with
backoff); another 400 with a JSON body -> :class:`BadRequestError` (this prompt is refused: the row is
recorded, the run goes on); anything else -> :class:`WrongServerError` (the run stops naming the URL).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx

from hsextract.contract.generate import (
    GENERATE_PATH,
    MODEL_INFO_PATH,
    SERVER_INFO_PATHS,
    GenerationAnswer,
    GenerationRequest,
    error_message,
    is_duplicate_rid,
)
from hsextract.errors import BadRequestError, ServerUnreachableError, TransientServerError, WrongServerError
from hsextract.extract.requests.client import ServerClient, json_body
from hsextract.extract.requests.http_threads import RequestsCancelled, ThreadedHTTP

log = logging.getLogger(__name__)

RID_PREFIX = "regen"
#: the reason of a prompt the server refused (errors file, metric label)
SERVER_REFUSED = "server refused"
#: the reason of a row whose requests kept failing after every retry (a rerun sends it again)
SERVER_ERROR = "server error"
_RETRIED = (408, 429)


def make_rid(run: str, row: int, turn: int, attempt: int) -> str:
    return f"{RID_PREFIX}-{run}-{row:09d}-{turn}-{attempt}"


@dataclass(frozen=True)
class DecodeAnswer:
    """What a regeneration reads of a :class:`~hsextract.contract.generate.GenerationAnswer`."""

    output_ids: list[int]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int | None


def _abort(body: Any) -> dict[str, Any] | None:
    """The finish reason of an aborted request (SGLang's ``{"type": "abort", "message", "status_code"}``)."""
    meta = body.get("meta_info") if isinstance(body, dict) else None
    reason = meta.get("finish_reason") if isinstance(meta, dict) else None
    return reason if isinstance(reason, dict) and reason.get("type") == "abort" else None


class GenerateClient:
    """Health and identity through the extractor's :class:`ServerClient`; decode requests on threads that
    each own their connection (``extract/requests/http_threads.py`` says why)."""

    def __init__(self, base_url: str, request_timeout_s: float, max_threads: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.server = ServerClient(self.base_url)
        self._http = ThreadedHTTP(self.base_url, httpx.Timeout(request_timeout_s, connect=10.0), max_threads)

    def close(self) -> None:
        self._http.close()
        self.server.close()

    def cancel(self) -> None:
        self._http.cancel()

    def _wrong(self, path: str, response: httpx.Response, what: str) -> WrongServerError:
        text = response.text[:200].replace("\n", " ")
        return WrongServerError(
            f"POST {self.base_url}{path} answered HTTP {response.status_code} ({text!r}): {what}. This is not an "
            "SGLang or hsextract server that generates: check --server (host, port, no proxy in between)"
        )

    def model_info(self) -> dict[str, Any]:
        """``/server_info`` (else ``/get_server_info``), completed by ``/get_model_info``: model_path and
        model_fingerprint when the server says."""
        info: dict[str, Any] = {}
        for path in (*SERVER_INFO_PATHS, MODEL_INFO_PATH):
            def get(client: httpx.Client, route: str = path) -> httpx.Response:
                return client.get(route, timeout=30.0)

            try:
                response = self._http.call(get)
            except (httpx.HTTPError, RequestsCancelled):
                continue
            body = json_body(response) if response.status_code == 200 else None
            if isinstance(body, dict):
                for key in ("model_path", "model_fingerprint", "engine", "engine_version", "served_model_name"):
                    if body.get(key) is not None and key not in info:
                        info[key] = body[key]
            if "model_path" in info and path != MODEL_INFO_PATH:
                break
        return info

    def generate(self, request: GenerationRequest) -> DecodeAnswer:
        """Send one request and wait for its answer; raises what the answer means (module docstring)."""
        body = request.to_json()

        def post(client: httpx.Client) -> httpx.Response:
            return client.post(GENERATE_PATH, json=body)

        rid = request.rid
        try:
            response = self._http.call(post)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachableError(f"{GENERATE_PATH} for {rid}: no connection to {self.base_url} ({exc})") from exc
        except httpx.TimeoutException as exc:
            raise TransientServerError(f"{GENERATE_PATH} for {rid} timed out: {exc}") from exc
        except (httpx.HTTPError, RequestsCancelled) as exc:
            raise TransientServerError(f"{GENERATE_PATH} for {rid} failed: {type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status in _RETRIED or status >= 500:
            raise TransientServerError(f"{GENERATE_PATH} for {rid} answered HTTP {status}: {response.text[:300]}")
        decoded = json_body(response)
        if status == 400 and is_duplicate_rid(error_message(decoded)):
            raise TransientServerError(f"the server still holds {rid} (HTTP 400: {response.text[:200]})")
        if status == 400 and decoded is not None:
            raise BadRequestError(SERVER_REFUSED, f"the server refused the prompt with HTTP 400: {response.text[:300]}")
        if status != 200:
            raise self._wrong(GENERATE_PATH, response, "expected 200, a 400 refusing the prompt, or a retryable error")
        if isinstance(decoded, list) and len(decoded) == 1:
            decoded = decoded[0]
        abort = _abort(decoded)
        if abort is not None:
            message = str(abort.get("message") or "aborted")
            if abort.get("status_code") == 400:
                raise BadRequestError(SERVER_REFUSED, f"the server aborted the request as bad (400): {message}")
            raise TransientServerError(f"the server aborted {rid}: {message}")
        answer = GenerationAnswer.parse(decoded)
        if answer is None or answer.finish_reason.type not in ("stop", "length"):
            raise self._wrong(
                GENERATE_PATH, response, "expected output_ids and meta_info (id, prompt_tokens, finish_reason stop or "
                "length) in a JSON object"
            )
        if answer.prompt_tokens != len(request.input_ids):
            raise TransientServerError(
                f"the server says {rid} had {answer.prompt_tokens} prompt tokens, {len(request.input_ids)} were sent"
            )
        return DecodeAnswer(answer.output_ids, answer.finish_reason.type, answer.prompt_tokens)
