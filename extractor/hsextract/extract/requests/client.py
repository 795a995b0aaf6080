"""HTTP client for the SGLang (or embedded) server: health, identity, the rows' prefills.

Answers are classified for what they mean (``/generate``; the answer to a POST of several rows is a list, one
answer a row in order, and its 400 sends each row again alone, :mod:`~hsextract.extract.requests.prefill_batches`):

* 200 with a JSON body: done.
* 400 "Duplicate request ID detected: <rid>": the server still holds an earlier request of this rid
  -> :class:`RidInUseError`, sent again once it lets go (never a bad sample).
* 400 with another JSON body: the server refuses this prompt -> :class:`BadSampleError` ``server_rejected``.
* no connection at all -> :class:`ServerUnreachableError`: the run waits for the server to come back.
* 408, 429, 5xx, a timeout or a dropped connection -> :class:`TransientServerError`, retried.
* anything else -- 401/403 (an auth layer), 404/405 (a wrong path or port), another 4xx, a 3xx,
  or a body that is HTML or not JSON (a proxy's page) -> :class:`WrongServerError`: the URL is not
  an SGLang server, every request would get the same answer, and the run stops naming the URL
  and the status instead of recording every row as bad input.

Every request runs on a request thread that owns its connection (:mod:`hsextract.extract.requests.http_threads`
says why); :meth:`ServerClient.send_prefill` returns a :class:`PendingAnswer` that the caller can wait
on, poll beside the request's dump, or abandon. Requests in flight can be cancelled from another
thread (:meth:`ServerClient.cancel`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from hsextract.contract.generate import (
    GENERATE_PATH,
    HEALTH_GENERATE_PATH,
    HEALTH_PATH,
    SERVER_INFO_PATHS,
    GenerateAnswer,
    GenerateRequest,
    error_message,
    is_duplicate_rid,
)
from hsextract.contract.model_config import read_model_config
from hsextract.contract.model_fingerprint import model_fingerprint
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.spot_check import STATES_MEDIA_TYPE, SpotCheckAnswer, SpotCheckRequest
from hsextract.contract.states import ErrorReason
from hsextract.errors import (
    BadSampleError,
    HsextractError,
    RidInUseError,
    ServerError,
    ServerUnreachableError,
    SpotCheckUnavailableError,
    TransientServerError,
    WrongServerError,
)
from hsextract.extract.requests.http_threads import KEEPALIVE_EXPIRY_S, RequestsCancelled, ThreadedHTTP
from hsextract.extract.requests.plain_post import PlainConnection
from hsextract.extract.requests.prefill_batches import ALONE, Outcome, PrefillBatches, RowRequest

log = logging.getLogger(__name__)

#: request threads (and connections) at most: ExtractConfig.concurrency is at most 1024, and rows
#: written before their answer came keep theirs for answer_grace_s more
MAX_REQUEST_THREADS = 2048
#: prompt tokens of one prefill POST at most (rows_per_request says how many rows). Its rows are answered
#: together, once the last is dumped: a forward's budget or two apart at most, within answer_grace_s (2 s) of
#: the first row's dump even at Kimi-K2.5's 16 k tokens/s. Long rows, whose POST costs little beside their
#: forward, go one or a few at a time
DEFAULT_TOKENS_PER_REQUEST = 8192
_RETRIED = (408, 429)
_JSON_BODY = {"Content-Type": "application/json"}
#: the spot check's answer: binary where the server offers it (a JSON one costs both sides' GIL for 0.2 s)
_SPOT_CHECK_ACCEPT = f"{STATES_MEDIA_TYPE}, application/json;q=0.5"


def _snippet(response: httpx.Response) -> str:
    text = response.text[:200].replace("\n", " ").strip()
    return repr(text) if text else "an empty body"


def json_body(response: httpx.Response) -> Any:
    """The decoded body, or None when it is not JSON (HTML, plain text, empty)."""
    content_type = response.headers.get("content-type", "")
    if "html" in content_type.lower():
        return None
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None


class PendingAnswer:
    """The answer to one ``/generate`` request, while it may still be on its way."""

    def __init__(
        self,
        request: GenerateRequest,
        future: concurrent.futures.Future[GenerateAnswer],
        abort: Callable[[], None],
        row: RowRequest | None = None,
    ) -> None:
        self.request = request
        self._future = future
        self._abort = abort
        self._row = row
        # One event per request, set when the answer is in: a row's worker waits on it many times, and
        # concurrent.futures.wait builds and installs a waiter (a condition and its lock) on every call.
        self._in = threading.Event()
        future.add_done_callback(lambda _: self._in.set())

    def wait(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: for good) for the answer or its failure; True once it is in."""
        return self._in.wait(timeout_s)

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> GenerateAnswer:
        """The answer; raises what the answer means (module docstring). Call once :meth:`done`."""
        try:
            return self._future.result()
        except (concurrent.futures.CancelledError, RequestsCancelled) as exc:
            raise TransientServerError(f"/generate for {self.request.rid} was cancelled before its answer came") from exc

    def cancel(self) -> None:
        """Give up on the answer: the request is cancelled (its connection shut if it is under way)."""
        self._abort()

    def dumped(self) -> None:
        """The row's dump is complete: its answer is all it waits for (:meth:`waits_for_other_rows`)."""
        if self._row is not None:
            self._row.dumped = True

    def waits_for_other_rows(self) -> bool:
        """Whether its answer waits for another row of its POST (not yet dumped): not late, however long."""
        return self._row is not None and self._row.others_waiting()

    def add_done_callback(self, callback: Callable[[PendingAnswer], object]) -> None:
        self._future.add_done_callback(lambda _: callback(self))


class ServerClient:
    def __init__(
        self,
        base_url: str,
        request_timeout_s: float = 600.0,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
        rows_per_request: int = 1,
        tokens_per_request: int = DEFAULT_TOKENS_PER_REQUEST,
        prefill_posts: int = MAX_REQUEST_THREADS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(request_timeout_s, connect=10.0)
        self._http = ThreadedHTTP(self.base_url, timeout, MAX_REQUEST_THREADS, keepalive_expiry_s)
        self._prefills = PrefillBatches(
            self._post_prefills, self._http.submit_plain, self._http.abort, rows_per_request, tokens_per_request, prefill_posts
        )
        #: called with the rows of each prefill POST that got an answer (the run's metrics)
        self.observe_rows_per_post: Callable[[int], None] | None = None

    def close(self) -> None:
        self._http.close()

    def cancel(self) -> int:
        """Fail every request in flight now, and every later one; return how many were in flight."""
        return self._http.cancel()

    def later(self, delay_s: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` (quick, non-blocking) after ``delay_s`` on the client's timer thread."""
        self._http.later(delay_s, callback)

    def _get(self, path: str, timeout_s: float) -> httpx.Response:
        def get(client: httpx.Client) -> httpx.Response:
            return client.get(path, timeout=timeout_s)

        try:
            return self._http.call(get)
        except RequestsCancelled as exc:
            raise httpx.TransportError(str(exc)) from exc

    def _wrong_server(self, method: str, path: str, response: httpx.Response, what: str) -> WrongServerError:
        return WrongServerError(
            f"{method} {self.base_url}{path} answered HTTP {response.status_code} "
            f"({response.headers.get('content-type', 'no content type')}: {_snippet(response)}): {what}. "
            "This is not an SGLang or hsextract server's answer: check --server (host, port, no proxy or auth page "
            "in between) and that the server is started"
        )

    def wait_until_healthy(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Wait for HTTP 200 on /health_generate (a real forward); nothing else counts. A refused
        connection, 408, 429 and 5xx are a server still starting and waited for; any other answer is
        :class:`WrongServerError` at once. Raises KeyboardInterrupt when ``stop`` is set meanwhile."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        delay = 0.25
        while True:
            try:
                response = self._get(HEALTH_GENERATE_PATH, 30.0)
                status = response.status_code
                if status == 200:
                    return
                if status < 500 and status not in _RETRIED:
                    # a starting server refuses connections or answers 503; a 404, 401, 3xx... is another
                    # program on that port (a plain web server, a URL ending in /generate): fail now
                    raise self._wrong_server(
                        "GET", HEALTH_GENERATE_PATH, response, "a starting server refuses connections or answers 503"
                    )
                last = f"HTTP {status} {response.text[:200]!r}"
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
            return self._get(HEALTH_PATH, 10.0).status_code == 200
        except httpx.HTTPError:
            return False

    def reachable(self) -> bool:
        """False only when no connection can be made (the server is down); a slow or failing answer is reachable."""
        try:
            self._get(HEALTH_PATH, 10.0)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return False
        except httpx.HTTPError:
            pass
        return True

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
        for path in SERVER_INFO_PATHS:
            try:
                response = self._get(path, 30.0)
            except httpx.HTTPError as exc:
                raise ServerError(f"cannot reach {self.base_url}{path}: {exc}") from exc
            if response.status_code == 200:
                info = json_body(response)
                if isinstance(info, dict):
                    return info
                raise self._wrong_server("GET", path, response, "expected the server's identity as a JSON object")
            answers.append(f"{path}: HTTP {response.status_code}")
        raise WrongServerError(
            f"server at {self.base_url} answers neither /server_info nor /get_server_info ({'; '.join(answers)}); "
            "check --server: it must be an SGLang or hsextract server"
        )

    def send_prefill(self, request: GenerateRequest) -> PendingAnswer:
        """POST /generate (``max_new_tokens`` 0), alone or with the other rows sending now
        (:mod:`~hsextract.extract.requests.prefill_batches`), and return at once; the answer comes as a
        :class:`PendingAnswer`."""
        row = self._prefills.send(request)
        return PendingAnswer(request, row.future, row.cancel, row)

    def _post_prefills(self, connection: PlainConnection, requests: list[GenerateRequest]) -> list[Outcome]:
        """One POST of ``requests`` on a request thread: one outcome a request, or raises for the whole exchange."""
        one = len(requests) == 1
        sent = requests[0].rid if one else f"{len(requests)} rows ({requests[0].rid} ... {requests[-1].rid})"
        body = orjson.dumps(requests[0].to_json() if one else GenerateRequest.batch_json(requests))
        try:
            response = connection.post(GENERATE_PATH, body, _JSON_BODY)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachableError(
                f"{GENERATE_PATH} for {sent}: no connection to {self.base_url} ({type(exc).__name__}: {exc})"
            ) from exc
        except httpx.TimeoutException as exc:
            raise TransientServerError(f"{GENERATE_PATH} for {sent} timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            raise TransientServerError(f"{GENERATE_PATH} for {sent} failed: {type(exc).__name__}: {exc}") from exc
        if self.observe_rows_per_post is not None:
            self.observe_rows_per_post(len(requests))
        if one:
            return [self._classify(requests[0], response)]
        return self._classify_batch(requests, sent, response)

    def spot_check(self, request: SpotCheckRequest) -> SpotCheckAnswer:
        """POST /generate asking for the engine's own hidden states (waits for the answer), in binary from a
        server that offers it (the embedded one), else SGLang's JSON.
        TransientServerError for a failed request; SpotCheckUnavailableError when the answer holds none."""
        body = request.to_json()

        def post(client: httpx.Client) -> httpx.Response:
            return client.post(GENERATE_PATH, json=body, headers={"Accept": _SPOT_CHECK_ACCEPT})

        try:
            response = self._http.call(post)
        except (httpx.HTTPError, RequestsCancelled) as exc:
            raise TransientServerError(f"spot check {request.rid} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise TransientServerError(f"spot check {request.rid} answered HTTP {response.status_code}: {response.text[:300]}")
        if response.headers.get("content-type", "").startswith(STATES_MEDIA_TYPE):
            answer = SpotCheckAnswer.parse_states_bytes(response.content)
        else:
            answer = SpotCheckAnswer.parse_bytes(response.content)
        if answer is None:
            raise SpotCheckUnavailableError(
                f"{self.base_url}{GENERATE_PATH} answered spot check {request.rid} without meta_info.hidden_states: "
                "start SGLang with --enable-return-hidden-states (hsextract launch-sglang does; "
                "--enable-return-aux-hidden-states implies it in 0.5.23), or run with --spot-check-every 0"
            )
        return answer

    def _classify(self, request: GenerateRequest, response: httpx.Response) -> GenerateAnswer:
        rid = request.rid
        status = response.status_code
        if status in _RETRIED or status >= 500:
            raise TransientServerError(f"{GENERATE_PATH} for {rid} answered HTTP {status}: {response.text[:300]}")
        body = json_body(response)
        if status == 400 and is_duplicate_rid(error_message(body)):
            raise RidInUseError(f"the server still holds an earlier request of {rid} (HTTP 400: {response.text[:200]})")
        if status == 400 and body is not None:
            raise BadSampleError(ErrorReason.SERVER_REJECTED, f"server refused {rid} with HTTP 400: {response.text[:300]}")
        if status != 200:
            raise self._wrong_server(
                "POST", GENERATE_PATH, response, "only 200, a 400 that rejects the prompt, or a retryable error are expected"
            )
        answer = self._answer(request, body, response)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _classify_batch(self, requests: list[GenerateRequest], sent: str, response: httpx.Response) -> list[Outcome]:
        """The answer to a POST of several rows: a 400 (about one of them) sends each again alone."""
        status = response.status_code
        if status in _RETRIED or status >= 500:
            raise TransientServerError(f"{GENERATE_PATH} for {sent} answered HTTP {status}: {response.text[:300]}")
        if status == 400:
            return [ALONE] * len(requests)
        body = json_body(response)
        count = len(requests)
        if status != 200 or not isinstance(body, list) or len(body) != count:
            raise self._wrong_server("POST", GENERATE_PATH, response, f"expected a list of {count} answers to {count} prompts")
        outcomes: list[Outcome] = []
        for request, item in zip(requests, body, strict=True):
            answer = self._answer(request, item, response)
            if isinstance(answer, GenerateAnswer) and answer.rid is not None and answer.rid != request.rid:
                answer = self._wrong_server(
                    "POST",
                    GENERATE_PATH,
                    response,
                    f"the answer in {request.rid}'s place is {answer.rid}'s: a batch is answered in the order of its prompts",
                )
            outcomes.append(answer)
        return outcomes

    def _answer(self, request: GenerateRequest, body: Any, response: httpx.Response) -> GenerateAnswer | HsextractError:
        """One prompt's answer in a 200's body, or what is wrong with it."""
        answer = GenerateAnswer.parse(body)
        if answer is None:
            return self._wrong_server("POST", GENERATE_PATH, response, "expected a JSON object with meta_info")
        sent = len(request.input_ids)
        if answer.prompt_tokens is not None and answer.prompt_tokens != sent:
            return TransientServerError(f"server says {request.rid} had {answer.prompt_tokens} prompt tokens, we sent {sent}")
        return answer
