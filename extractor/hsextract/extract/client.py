"""HTTP client for the SGLang (or embedded) server: health, identity, one-prompt prefill."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from hsextract.contract.model_config import read_model_config
from hsextract.contract.server_info import FINAL_PRENORM_KEY, ServerInfo
from hsextract.errors import BadSampleError, ServerError, TransientServerError

log = logging.getLogger(__name__)


class ServerClient:
    def __init__(self, base_url: str, request_timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(request_timeout_s, connect=10.0),
            transport=transport,
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    def close(self) -> None:
        self._http.close()

    def wait_until_healthy(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Wait for HTTP 200 on /health_generate (a real forward); nothing else counts."""
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
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"server at {self.base_url} did not answer HTTP 200 on /health_generate within "
                    f"{timeout_s:.0f} s (last: {last}); start it (hsextract serve, make restart) or check its log"
                )
            sleep(delay)
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
        return ServerInfo.parse(info, read_model_config(model_path) if model_path else {}, vocab_override)

    def _server_info_json(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self._http.get(path, timeout=30.0)
            except httpx.HTTPError as exc:
                raise ServerError(f"cannot reach {self.base_url}{path}: {exc}") from exc
            if response.status_code == 200:
                info = response.json()
                if isinstance(info, dict):
                    return info
        raise ServerError(f"server at {self.base_url} answers neither /server_info nor /get_server_info")

    def prefill(self, rid: str, input_ids: list[int], final_prenorm: bool = False) -> dict[str, Any]:
        """POST /generate with max_new_tokens 0; returns meta_info. ``final_prenorm`` asks a server
        that dumps the pre-norm state per request (``final_prenorm_per_request``) to dump it.

        Raises BadSampleError for a 4xx (the server refused this prompt), TransientServerError
        for anything worth retrying.
        """
        payload: dict[str, Any] = {"input_ids": input_ids, "rid": rid, "sampling_params": {"max_new_tokens": 0}}
        if final_prenorm:
            payload[FINAL_PRENORM_KEY] = True
        try:
            response = self._http.post("/generate", json=payload)
        except httpx.TimeoutException as exc:
            raise TransientServerError(f"/generate for {rid} timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            raise TransientServerError(f"/generate for {rid} failed: {type(exc).__name__}: {exc}") from exc
        if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
            raise BadSampleError(
                "server_rejected", f"server refused {rid} with HTTP {response.status_code}: {response.text[:300]}"
            )
        if response.status_code != 200:
            raise TransientServerError(f"/generate for {rid} answered HTTP {response.status_code}: {response.text[:300]}")
        body = response.json()
        if isinstance(body, list):  # SGLang answers a list for batched input
            body = body[0]
        meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
        prompt_tokens = meta.get("prompt_tokens")
        if prompt_tokens is not None and prompt_tokens != len(input_ids):
            raise TransientServerError(f"server says {rid} had {prompt_tokens} prompt tokens, we sent {len(input_ids)}")
        return dict(meta)
