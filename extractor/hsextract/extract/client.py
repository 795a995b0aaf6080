"""HTTP client for the SGLang (or embedded) server: health, identity, one-prompt prefill."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from hsextract.contract.model_config import read_model_config
from hsextract.errors import BadSampleError, ServerError

log = logging.getLogger(__name__)


class TransientServerError(ServerError):
    """A failure worth retrying: connection refused or reset, timeout, HTTP 5xx."""


@dataclass(frozen=True)
class ServerIdentity:
    """What the server serves, from /server_info (plus the model's config.json when readable)."""

    model_path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str | None
    layer_ids: list[int] | None  # aux, 0-based; None when the server does not say
    dump_dir: str | None
    engine: str
    provides_final_prenorm: bool | None


def parse_identity(info: dict[str, Any], vocab_override: int | None = None) -> ServerIdentity:
    model_path = str(info.get("model_path", ""))
    config = read_model_config(model_path) if model_path else {}

    def pick(*names: str) -> Any:
        for name in names:
            if info.get(name) is not None:
                return info[name]
            if config.get(name) is not None:
                return config[name]
        return None

    num_layers, hidden, vocab = pick("num_hidden_layers"), pick("hidden_size"), pick("vocab_size")
    vocab = vocab_override or vocab
    missing = [n for n, v in (("num_hidden_layers", num_layers), ("hidden_size", hidden), ("vocab_size", vocab)) if v is None]
    if missing:
        raise ServerError(
            f"the server's /server_info does not give {missing} and the model's config.json at "
            f"{model_path or '(no model_path)'} is not readable from here; mount the model at the same path "
            "or set vocab_size in the extractor config"
        )
    dtype = info.get("dtype") or config.get("dtype") or config.get("torch_dtype")
    return ServerIdentity(
        model_path=model_path,
        num_layers=int(num_layers),
        hidden_size=int(hidden),
        vocab_size=int(vocab),
        dtype=None if dtype in (None, "auto") else str(dtype),
        layer_ids=info.get("layer_ids"),
        dump_dir=info.get("dump_dir"),
        engine=str(info.get("engine", "sglang")),
        provides_final_prenorm=info.get("provides_final_prenorm"),
    )


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

    def server_info(self) -> dict[str, Any]:
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

    def prefill(self, rid: str, input_ids: list[int]) -> dict[str, Any]:
        """POST /generate with max_new_tokens 0; returns meta_info.

        Raises BadSampleError for a 4xx (the server refused this prompt), TransientServerError
        for anything worth retrying.
        """
        payload = {"input_ids": input_ids, "rid": rid, "sampling_params": {"max_new_tokens": 0}}
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
