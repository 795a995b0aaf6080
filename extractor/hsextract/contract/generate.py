"""``POST /generate``: the one request the extractor sends and the answer it reads, the generation
request and answer (``max_new_tokens > 0``: :class:`GenerationRequest`, :class:`GenerationAnswer`), and the routes.

The client (:mod:`hsextract.extract.requests.client`), the embedded server
(:mod:`hsextract.capture.front.http`) and the tests all build and read these messages here, so
the two sides cannot drift. The shapes are SGLang's (``GenerateReqInput`` in
``sglang/srt/managers/io_struct.py`` and its ``/generate`` answer for ``max_new_tokens: 0``), plus
two hsextract keys: :data:`FINAL_PRENORM_KEY`, that only a server saying ``final_prenorm_per_request``
reads, and :data:`STORAGE_KEY` (``"float8_e4m3fn"``), that only a server saying ``fp8_per_request`` reads.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hsextract.contract.files.storages import STORAGES
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
    """A prefill-only ``/generate`` request: one prompt of token ids, no decoding.

    Several go in one body as SGLang's batch (:meth:`batch_json`: ``input_ids`` and ``rid`` lists, one
    ``sampling_params``), answered by a list in the same order; their hsextract keys are the body's, so a
    batch holds requests that agree on them (:meth:`batch_key`).
    """

    rid: str
    input_ids: list[int]
    final_prenorm: bool = False  # ask for the pre-norm final state too (only the speculators format needs it)
    storage: str | None = None  # "float8_e4m3fn": dump as FP8 (contract.fp8); None: the model's dtype

    def to_json(self) -> dict[str, Any]:
        return self._with_keys({"input_ids": self.input_ids, "rid": self.rid, "sampling_params": {"max_new_tokens": 0}})

    def batch_key(self) -> tuple[bool, str | None]:
        """What the requests of one batch must share: the body-wide hsextract keys."""
        return self.final_prenorm, self.storage

    @staticmethod
    def batch_json(requests: list[GenerateRequest]) -> dict[str, Any]:
        """One body for several prompts (SGLang's batched form), answered by a list in the same order."""
        first = requests[0]
        if any(r.batch_key() != first.batch_key() for r in requests):
            raise ValueError("the requests of one batch must agree on final_prenorm and storage")
        body = {"input_ids": [r.input_ids for r in requests], "rid": [r.rid for r in requests]}
        return first._with_keys({**body, "sampling_params": {"max_new_tokens": 0}})

    def _with_keys(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.final_prenorm:
            body[FINAL_PRENORM_KEY] = True
        if self.storage is not None:
            body[STORAGE_KEY] = self.storage
        return body

    @classmethod
    def parse(cls, body: Any, vocab_size: int) -> GenerateRequest:
        """The one-prompt request a server accepts, or :class:`BadRequestError` naming what is wrong (HTTP 400)."""
        requests, batched = cls.parse_batch(body, vocab_size)
        if batched:
            raise BadRequestError("non_integer_ids", "input_ids must hold integers only (one prompt per request)")
        return requests[0]

    @classmethod
    def parse_batch(cls, body: Any, vocab_size: int) -> tuple[list[GenerateRequest], bool]:
        """The requests of a body (one prompt, or SGLang's batch of them) and whether it was batched (then the
        answer is a list); :class:`BadRequestError` naming what is wrong (HTTP 400)."""
        if not isinstance(body, dict):
            raise BadRequestError("not_an_object", "request body must be a JSON object")
        ids = body.get("input_ids")
        batched = isinstance(ids, list) and bool(ids) and all(isinstance(p, list) for p in ids)
        prompts: list[Any] = ids if batched else [ids]  # type: ignore[assignment]
        for prompt in prompts:
            if not isinstance(prompt, list) or not prompt:
                raise BadRequestError(
                    "no_input_ids",
                    "input_ids must be a non-empty list of token ids, or a list of them (this server takes no text)",
                )
            if any(type(i) is not int for i in prompt):
                raise BadRequestError("non_integer_ids", "input_ids must hold integers only (one prompt, or a list of prompts)")
            if min(prompt) < 0 or max(prompt) >= vocab_size:
                raise BadRequestError(
                    "out_of_vocab", f"input_ids must lie in [0, {vocab_size}): got {min(prompt)}..{max(prompt)}"
                )
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict) or params.get("max_new_tokens", 0) != 0:
            raise BadRequestError(
                "decode_requested",
                "sampling_params.max_new_tokens must be 0 (extraction) or a positive integer (generation, GenerationRequest)",
            )
        rids = _batch_rids(body.get("rid"), len(prompts), batched)
        final_prenorm = body.get(FINAL_PRENORM_KEY, False)
        if not isinstance(final_prenorm, bool):
            raise BadRequestError("bad_final_prenorm", f"{FINAL_PRENORM_KEY} must be true or false")
        storage = body.get(STORAGE_KEY)
        if storage is not None and storage not in STORAGES:
            raise BadRequestError(
                "bad_storage",
                f"{STORAGE_KEY} {storage!r} is not a storage this server writes: leave it out or send {STORAGES[0]!r}",
            )
        return [cls(rid, prompt, final_prenorm, storage) for rid, prompt in zip(rids, prompts, strict=True)], batched


def _batch_rids(rid: Any, count: int, batched: bool) -> list[str]:
    """SGLang's rids of a body: a string (a batch's prefix, ``<rid>_<i>``), a list for a batch, or absent."""
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(count)]
    elif isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(count)] if batched else [rid]
    elif isinstance(rid, list) and batched and all(isinstance(r, str) for r in rid):
        if len(rid) != count:
            raise BadRequestError("bad_rid", f"{len(rid)} rids for {count} prompts")
        rids = rid
    else:
        raise BadRequestError("bad_rid", "rid must be a string (or, for a batch, a list of strings)")
    if len(set(rids)) != len(rids):
        raise BadRequestError("bad_rid", "the rids of a batch must be distinct")
    return rids


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


# -- generation (``max_new_tokens > 0``) ----------------------------------------------------------------
#: SGLang's ``sampling_params`` keys this contract sends and the embedded server honours
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "sampling_seed", "ignore_eos")
#: SGLang keys the embedded server accepts only at their no-op value (any other value is refused: 400)
NEUTRAL_SAMPLING = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "stop": None,
    "stop_regex": None,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "logit_bias": None,
}
_SAMPLING_EPS = 1e-6  # SGLang's: a temperature below it is greedy


@dataclass(frozen=True)
class SamplingParams:
    """SGLang's ``sampling_params`` for a decoding request (its defaults, ``sampling/sampling_params.py``).

    ``temperature`` 0 (below 1e-6) is greedy, as SGLang reads it (top-k 1). ``seed`` travels as SGLang's
    ``sampling_seed``; SGLang 0.5.23 honours it only under ``--enable-deterministic-inference``, the embedded
    server always (a per-request generator: the same seed gives the same tokens whatever is batched with it).
    Generation stops at ``stop_token_ids`` and the model's eos ids (config.json and generation_config.json)
    unless ``ignore_eos``; the stop token is the last of ``output_ids``.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS or self.top_k == 1

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}
        if self.top_p != 1.0:
            body["top_p"] = self.top_p
        if self.top_k != -1:
            body["top_k"] = self.top_k
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            body["sampling_seed"] = self.seed
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    @classmethod
    def parse(cls, params: Any, vocab_size: int) -> SamplingParams:
        """The parameters a server honours, or :class:`BadRequestError` naming the key (HTTP 400)."""
        if not isinstance(params, dict):
            raise BadRequestError("bad_sampling_params", "sampling_params must be a JSON object")
        for key, value in params.items():
            if key in SAMPLING_KEYS:
                continue
            if key not in NEUTRAL_SAMPLING:
                raise BadRequestError(
                    "bad_sampling_params", f"sampling_params.{key} is not supported here; send only {', '.join(SAMPLING_KEYS)}"
                )
            neutral = NEUTRAL_SAMPLING[key]
            if value is not None and value != neutral and not (key in ("stop", "stop_regex") and value in ([], "")):
                raise BadRequestError(
                    "bad_sampling_params",
                    f"sampling_params.{key}={value!r} is not supported here: leave it out or send {neutral!r}",
                )

        def number(key: str, default: float) -> float:
            value = params.get(key)
            if value is None:
                return default
            if type(value) not in (int, float) or not math.isfinite(value):
                raise BadRequestError("bad_sampling_params", f"sampling_params.{key} must be a finite number, got {value!r}")
            return float(value)

        def integer(key: str, default: int) -> int:
            value = params.get(key)
            if value is None:
                return default
            if type(value) is not int:
                raise BadRequestError("bad_sampling_params", f"sampling_params.{key} must be an integer, got {value!r}")
            return value

        max_new = integer("max_new_tokens", 128)
        temperature, top_p, top_k = number("temperature", 1.0), number("top_p", 1.0), integer("top_k", -1)
        if max_new < 0:
            raise BadRequestError("bad_sampling_params", f"sampling_params.max_new_tokens must be at least 0, got {max_new}")
        if temperature < 0:
            raise BadRequestError("bad_sampling_params", f"sampling_params.temperature must be at least 0, got {temperature:g}")
        if not 0 < top_p <= 1:
            raise BadRequestError("bad_sampling_params", f"sampling_params.top_p must be in (0, 1], got {top_p:g}")
        if top_k != -1 and top_k < 1:
            raise BadRequestError("bad_sampling_params", f"sampling_params.top_k must be -1 (off) or at least 1, got {top_k}")
        stops = params.get("stop_token_ids") or []
        if not isinstance(stops, list) or any(type(t) is not int or not 0 <= t < vocab_size for t in stops):
            raise BadRequestError(
                "bad_sampling_params", f"sampling_params.stop_token_ids must be a list of token ids in [0, {vocab_size})"
            )
        seed = params.get("sampling_seed")
        if seed is not None and type(seed) is not int:
            raise BadRequestError("bad_sampling_params", f"sampling_params.sampling_seed must be an integer, got {seed!r}")
        ignore_eos = params.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise BadRequestError("bad_sampling_params", "sampling_params.ignore_eos must be true or false")
        if temperature < _SAMPLING_EPS:  # SGLang: greedy is top-k 1
            temperature, top_k = 0.0, 1
        return cls(max_new, temperature, top_p, top_k, tuple(sorted(set(stops))), seed, ignore_eos)


def wants_decoding(body: Any) -> bool:
    """Whether a ``/generate`` body asks for generated tokens (else it is an extraction prefill)."""
    if not isinstance(body, dict):
        return False
    params = body.get("sampling_params")
    every = params if isinstance(params, list) else [params]
    return any(isinstance(p, dict) and type(p.get("max_new_tokens")) is int and p["max_new_tokens"] > 0 for p in every)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to decode from: ``/generate`` with ``input_ids`` and ``max_new_tokens > 0``.

    A batch (SGLang's list of lists of ``input_ids``, one ``sampling_params`` or a list of them, ``rid``
    a list, a prefix that becomes ``<rid>_<i>``, or absent) is :meth:`parse_batch`'s list; its answer is a
    list in the same order.
    """

    rid: str
    input_ids: list[int]
    sampling: SamplingParams = SamplingParams()

    def to_json(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "rid": self.rid, "sampling_params": self.sampling.to_json()}

    @staticmethod
    def batch_json(requests: list[GenerationRequest]) -> dict[str, Any]:
        """One body for several prompts (SGLang's batched form); answered by a list."""
        return {
            "input_ids": [r.input_ids for r in requests],
            "rid": [r.rid for r in requests],
            "sampling_params": [r.sampling.to_json() for r in requests],
        }

    @classmethod
    def parse_batch(cls, body: Any, vocab_size: int) -> tuple[list[GenerationRequest], bool]:
        """The requests of a body and whether it was batched (then the answer is a list)."""
        if not isinstance(body, dict):
            raise BadRequestError("not_an_object", "request body must be a JSON object")
        if body.get("input_ids") is None and body.get("text") is not None:
            raise BadRequestError("no_input_ids", "this server takes input_ids only, no text")
        ids = body.get("input_ids")
        batched = isinstance(ids, list) and bool(ids) and all(isinstance(p, list) for p in ids)
        prompts: list[Any] = ids if batched else [ids]  # type: ignore[assignment]
        for prompt in prompts:
            if not isinstance(prompt, list) or not prompt:
                raise BadRequestError("no_input_ids", "input_ids must be a non-empty list of token ids (or a list of them)")
            if any(type(i) is not int for i in prompt):
                raise BadRequestError("non_integer_ids", "input_ids must hold integers only")
            if min(prompt) < 0 or max(prompt) >= vocab_size:
                raise BadRequestError(
                    "out_of_vocab", f"input_ids must lie in [0, {vocab_size}): got {min(prompt)}..{max(prompt)}"
                )
        count = len(prompts)
        params = body.get("sampling_params") or {}
        if isinstance(params, list):
            if len(params) != count:
                raise BadRequestError("bad_sampling_params", f"{len(params)} sampling_params for {count} prompts")
            sampling = [SamplingParams.parse(p, vocab_size) for p in params]
        else:
            sampling = [SamplingParams.parse(params, vocab_size)] * count
        rids = _batch_rids(body.get("rid"), count, batched)
        for key in (FINAL_PRENORM_KEY, STORAGE_KEY):
            if body.get(key):
                raise BadRequestError("bad_request", f"{key} applies to extraction (max_new_tokens 0) only")
        return [cls(r, p, s) for r, p, s in zip(rids, prompts, sampling, strict=True)], batched


@dataclass(frozen=True)
class FinishReason:
    """SGLang's ``meta_info.finish_reason``: ``{"type": "stop", "matched": <token id>}`` or
    ``{"type": "length", "length": <max_new_tokens>}``."""

    type: str  # "stop" | "length" | "abort"
    matched: int | None = None
    length: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": self.type}

    @classmethod
    def parse(cls, body: Any) -> FinishReason | None:
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return None
        matched, length = body.get("matched"), body.get("length")
        return cls(body["type"], matched if type(matched) is int else None, length if type(length) is int else None)


@dataclass(frozen=True)
class GenerationAnswer:
    """The answer to one :class:`GenerationRequest`, as SGLang gives it under ``--skip-tokenizer-init``
    (``output_ids`` hold the generated tokens, the matched stop token included)."""

    rid: str
    output_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    e2e_latency: float | None = None

    @property
    def truncated(self) -> bool:
        """Cut by ``max_new_tokens`` rather than ended by a stop token."""
        return self.finish_reason.type == "length"

    def to_json(self) -> dict[str, Any]:
        return {
            "output_ids": self.output_ids,
            "meta_info": {
                "id": self.rid,
                "finish_reason": self.finish_reason.to_json(),
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": len(self.output_ids),
                "cached_tokens": 0,
                "e2e_latency": self.e2e_latency,
            },
        }

    @classmethod
    def parse(cls, body: Any) -> GenerationAnswer | None:
        """One answer object (SGLang's or the embedded server's), None when ``body`` is not one."""
        if not isinstance(body, dict):
            return None
        ids, meta = body.get("output_ids"), body.get("meta_info")
        if not isinstance(ids, list) or any(type(i) is not int for i in ids) or not isinstance(meta, dict):
            return None
        finish = FinishReason.parse(meta.get("finish_reason"))
        rid, prompt_tokens, latency = meta.get("id"), meta.get("prompt_tokens"), meta.get("e2e_latency")
        if finish is None or not isinstance(rid, str) or type(prompt_tokens) is not int:
            return None
        return cls(rid, ids, finish, prompt_tokens, float(latency) if isinstance(latency, (int, float)) else None)

    @classmethod
    def parse_list(cls, body: Any) -> list[GenerationAnswer] | None:
        """The answers of a batched (list) or single (object) body, None when any is not one."""
        items = body if isinstance(body, list) else [body]
        answers = [cls.parse(item) for item in items]
        return None if any(a is None for a in answers) else [a for a in answers if a is not None]


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
