"""``POST /generate``: the one request the extractor sends and the answer it reads, and the routes.

The client (:mod:`hsextract.extract.client`), the embedded server
(:mod:`hsextract.capture.front.http`) and the tests all build and read these messages here, so
the two sides cannot drift. The shapes are SGLang's (``GenerateReqInput`` in
``sglang/srt/managers/io_struct.py`` and its ``/generate`` answer for ``max_new_tokens: 0``), plus
two hsextract keys: :data:`FINAL_PRENORM_KEY`, that only a server saying ``final_prenorm_per_request``
reads, and :data:`STORAGE_KEY` (``"float8_e4m3fn"``), that only a server saying ``fp8_per_request`` reads.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from hsextract.contract.fp8 import STORAGES
from hsextract.contract.server_info import FINAL_PRENORM_KEY, STORAGE_KEY
from hsextract.errors import BadRequestError

# -- routes (SGLang's names) -------------------------------------------------------------------------
GENERATE_PATH = "/generate"
HEALTH_PATH = "/health"
#: 200 only after a real one-token forward (SGLang and the embedded server alike)
HEALTH_GENERATE_PATH = "/health_generate"
#: the server's identity; SGLang answers the second on older versions
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_INFO_PATH = "/get_model_info"
METRICS_PATH = "/metrics"

#: rid prefix of the embedded server's health forwards (never dumped: not the extractor's prefix)
HEALTH_RID_PREFIX = "HEALTH_CHECK_"


@dataclass(frozen=True)
class GenerateRequest:
    """A prefill-only ``/generate`` request: one prompt of token ids, no decoding."""

    rid: str
    input_ids: list[int]
    final_prenorm: bool = False  # ask for the pre-norm final state too (only the speculators format needs it)
    storage: str | None = None  # "float8_e4m3fn": dump as FP8 (contract.fp8); None: the model's dtype

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"input_ids": self.input_ids, "rid": self.rid, "sampling_params": {"max_new_tokens": 0}}
        if self.final_prenorm:
            body[FINAL_PRENORM_KEY] = True
        if self.storage is not None:
            body[STORAGE_KEY] = self.storage
        return body

    @classmethod
    def parse(cls, body: Any, vocab_size: int) -> GenerateRequest:
        """The request a server accepts, or :class:`BadRequestError` naming what is wrong (HTTP 400)."""
        if not isinstance(body, dict):
            raise BadRequestError("not_an_object", "request body must be a JSON object")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids:
            raise BadRequestError("no_input_ids", "input_ids must be a non-empty list of token ids (this server takes no text)")
        if any(type(i) is not int for i in ids):
            raise BadRequestError("non_integer_ids", "input_ids must hold integers only (one prompt per request)")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise BadRequestError("out_of_vocab", f"input_ids must lie in [0, {vocab_size}): got {min(ids)}..{max(ids)}")
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
        storage = body.get(STORAGE_KEY)
        if storage is not None and storage not in STORAGES:
            raise BadRequestError(
                "bad_storage",
                f"{STORAGE_KEY} {storage!r} is not a storage this server writes: leave it out or send {STORAGES[0]!r}",
            )
        return cls(rid, ids, final_prenorm, storage)


@dataclass(frozen=True)
class GenerateAnswer:
    """The answer's ``meta_info``, as far as the extractor reads it."""

    rid: str | None
    prompt_tokens: int | None  # None: the server did not say
    e2e_latency: float | None = None

    @classmethod
    def for_prefill(cls, rid: str, prompt_tokens: int, arrived: float) -> GenerateAnswer:
        """A finished prefill of ``prompt_tokens`` that arrived at ``arrived`` (``time.monotonic``)."""
        return cls(rid, prompt_tokens, time.monotonic() - arrived)

    def to_json(self) -> dict[str, Any]:
        """SGLang's answer to a ``max_new_tokens: 0`` request."""
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": self.rid,
                "finish_reason": {"type": "length", "length": 0},
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "e2e_latency": self.e2e_latency,
            },
        }

    @classmethod
    def parse(cls, body: Any) -> GenerateAnswer | None:
        """The answer in a decoded body, or None when it is not one (the caller names the server)."""
        if isinstance(body, list) and body:  # SGLang answers a list for batched input
            body = body[0]
        if not isinstance(body, dict):
            return None
        meta = body.get("meta_info", {})
        meta = meta if isinstance(meta, dict) else {}
        tokens = meta.get("prompt_tokens")
        latency = meta.get("e2e_latency")
        rid = meta.get("id")
        return cls(
            rid if isinstance(rid, str) else None,
            tokens if isinstance(tokens, int) else None,
            float(latency) if isinstance(latency, (int, float)) else None,
        )


def error_body(status: int, message: str) -> dict[str, Any]:
    """SGLang's error answer: ``{"error": {"message": ..., "code": status}}``."""
    return {"error": {"message": message, "code": status}}


def error_message(body: Any) -> str | None:
    """The message of an :func:`error_body`, None when ``body`` is not one."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


#: SGLang's HTTP 400 message for a rid it still holds (``TokenizerManager``: ``Duplicate request ID
#: detected: <rid>``). A server holds a rid until that request is finished or, after its client went
#: away, aborted: SGLang notices a closed connection only every few seconds. The embedded server
#: answers the same; the client waits for the rid to be let go (never a bad sample).
DUPLICATE_RID_PREFIX = "Duplicate request ID detected: "


def duplicate_rid_message(rid: str) -> str:
    return f"{DUPLICATE_RID_PREFIX}{rid}"


def is_duplicate_rid(message: str | None) -> bool:
    return message is not None and message.startswith(DUPLICATE_RID_PREFIX)
