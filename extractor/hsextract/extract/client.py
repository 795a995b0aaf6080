"""HTTP client for the SGLang (or embedded) server: health, identity, one-prompt prefill.

Answers are classified for what they mean (``/generate``):

* 200 with a JSON body: done.
* 400 with a JSON body: the server refuses this prompt -> :class:`BadSampleError` ``server_rejected``.
* 408, 429, 5xx, a timeout or a dropped connection -> :class:`TransientServerError`, retried.
* anything else -- 401/403 (an auth layer), 404/405 (a wrong path or port), another 4xx, a 3xx,
  or a body that is HTML or not JSON (a proxy's page) -> :class:`WrongServerError`: the URL is not
  an SGLang server, every request would get the same answer, and the run stops naming the URL
  and the status instead of recording every row as bad input.

Requests in flight can be cancelled from another thread (:meth:`ServerClient.cancel`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Any

import httpx

from hsextract.contract.model_config import read_model_config
from hsextract.contract.model_fingerprint import model_fingerprint
from hsextract.contract.server_info import FINAL_PRENORM_KEY, ServerInfo
from hsextract.contract.states import ErrorReason
from hsextract.errors import BadSampleError, ServerError, TransientServerError, WrongServerError
from hsextract.extract.http_transport import CancellableTransport

log = logging.getLogger(__name__)

_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
_RETRIED = (408, 429)


def _snippet(response: httpx.Response) -> str:
    text = response.text[:200].replace("\n", " ").strip()
    return repr(text) if text else "an empty body"


def _json_body(response: httpx.Response) -> Any:
    """The decoded body, or None when it is not JSON (HTML, plain text, empty)."""
    content_type = response.headers.get("content-type", "")
    if "html" in content_type.lower():
        return None
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None


class ServerClient:
    def __init__(self, base_url: str, request_timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._cancellable = CancellableTransport(_LIMITS) if transport is None else None
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(request_timeout_s, connect=10.0),
            transport=transport or self._cancellable,
            limits=_LIMITS,
        )

    def close(self) -> None:
        self._http.close()

    def cancel(self) -> int:
        """Fail every request in flight now, and every later one; return the connections shut."""
        return self._cancellable.cancel() if self._cancellable is not None else 0

    def _wrong_server(self, method: str, path: str, response: httpx.Response, what: str) -> WrongServerError:
        return WrongServerError(
            f"{method} {self.base_url}{path} answered HTTP {response.status_code} "
            f"({response.headers.get('content-type', 'no content type')}: {_snippet(response)}): {what}. "
            "This is not an SGLang or hsextract server's answer: check --server (host, port, no proxy or auth page "
            "in between) and that the server is started"
        )

    def wait_until_healthy(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Wait for HTTP 200 on /health_generate (a real forward); nothing else counts.
        Raises KeyboardInterrupt when ``stop`` is set meanwhile."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        delay = 0.25
        while True:
            try:
                response = self._http.get("/health_generate", timeout=30.0)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code} {response.text[:200]!r}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"server at {self.base_url} did not answer HTTP 200 on /health_generate within "
                    f"{timeout_s:.0f} s (last: {last}); start it (hsextract serve, make restart) or check its log"
                )
            if stop.wait(delay):
                raise KeyboardInterrupt
            delay = min(delay * 2, 5.0)

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=10.0).status_code == 200
        except httpx.HTTPError:
            return False

    def server_info(self, vocab_override: int | None = None) -> ServerInfo:
        """The server's identity, completed from the model's config.json where readable."""
        info = self._server_info_json()
        model_path = str(info.get("model_path", ""))
        parsed = ServerInfo.parse(info, read_model_config(model_path) if model_path else {}, vocab_override)
        if parsed.model_fingerprint is None and model_path:  # SGLang does not say: look at the files ourselves
            fingerprint = model_fingerprint(model_path)
            if fingerprint is not None:
                parsed = dataclasses.replace(parsed, model_fingerprint=fingerprint)
        return parsed

    def _server_info_json(self) -> dict[str, Any]:
        answers = []
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self._http.get(path, timeout=30.0)
            except httpx.HTTPError as exc:
                raise ServerError(f"cannot reach {self.base_url}{path}: {exc}") from exc
            if response.status_code == 200:
                info = _json_body(response)
                if isinstance(info, dict):
                    return info
                raise self._wrong_server("GET", path, response, "expected the server's identity as a JSON object")
            answers.append(f"{path}: HTTP {response.status_code}")
        raise WrongServerError(
            f"server at {self.base_url} answers neither /server_info nor /get_server_info ({'; '.join(answers)}); "
            "check --server: it must be an SGLang or hsextract server"
        )

    def prefill(self, rid: str, input_ids: list[int], final_prenorm: bool = False) -> dict[str, Any]:
        """POST /generate with max_new_tokens 0; returns meta_info (classification: module docstring).
        ``final_prenorm`` asks a server that dumps the pre-norm state per request
        (``final_prenorm_per_request``) to dump it."""
        payload: dict[str, Any] = {"input_ids": input_ids, "rid": rid, "sampling_params": {"max_new_tokens": 0}}
        if final_prenorm:
            payload[FINAL_PRENORM_KEY] = True
        try:
            response = self._http.post("/generate", json=payload)
        except httpx.TimeoutException as exc:
            raise TransientServerError(f"/generate for {rid} timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            raise TransientServerError(f"/generate for {rid} failed: {type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status in _RETRIED or status >= 500:
            raise TransientServerError(f"/generate for {rid} answered HTTP {status}: {response.text[:300]}")
        body = _json_body(response)
        if status == 400 and body is not None:
            raise BadSampleError(ErrorReason.SERVER_REJECTED, f"server refused {rid} with HTTP 400: {response.text[:300]}")
        if status != 200:
            raise self._wrong_server(
                "POST", "/generate", response, "only 200, a 400 that rejects the prompt, or a retryable error are expected"
            )
        if isinstance(body, list) and body:  # SGLang answers a list for batched input
            body = body[0]
        if not isinstance(body, dict):
            raise self._wrong_server("POST", "/generate", response, "expected a JSON object with meta_info")
        meta = body.get("meta_info", {})
        meta = meta if isinstance(meta, dict) else {}
        prompt_tokens = meta.get("prompt_tokens")
        if prompt_tokens is not None and prompt_tokens != len(input_ids):
            raise TransientServerError(f"server says {rid} had {prompt_tokens} prompt tokens, we sent {len(input_ids)}")
        return dict(meta)
