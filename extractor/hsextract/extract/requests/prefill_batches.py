"""Rows' prefill requests, several to one ``POST /generate`` (SGLang's batched form).

Each POST costs both sides a fixed amount of interpreter time (the HTTP exchange, the server's route and its
event loop, a request thread's hand-off), which with a fast forward is the run's limit on short rows: the
embedded server spent 5.5 ms of CPU a row posted alone and 2.9 ms a row posted eight at a time (CPU, tiny
model). No row is held back while the server could take it: a row opens a POST and hands it to a request
thread at once while fewer than ``max_posts`` POSTs are out, and the rows that send before that thread takes
it up join it. Once every slot is out, the rows sent meanwhile join one POST that waits for the next free
slot, or goes as soon as it is full (``rows_per_request`` rows, ``max_tokens`` prompt tokens, or the next
row does not fit): it would gain nothing by waiting. A lone row goes alone, as before; under load POSTs fill.

Every row keeps a request of its own for what the rest of the extractor sees (:class:`RowRequest`):

- its answer is its own element of the list the server answers (its rid checked), or the failure of the
  whole exchange (no connection, 5xx, a timeout), which each row handles as it would its own;
- a 400 to a POST of several rows (one bad prompt, or a rid the server still holds) sends each of them
  again alone, so the 400 reaches only the row it is about;
- cancelling one row (the watchdog's resend, an answer past its grace) gives up its answer only; the
  exchange is aborted once every row in it has been cancelled. A POST not yet taken up skips its
  cancelled rows.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from hsextract.contract.generate import GenerateAnswer, GenerateRequest
from hsextract.extract.requests.http_threads import RequestsCancelled
from hsextract.extract.requests.plain_post import PlainConnection

#: the server's 400 to a POST of several rows: send each again alone (the 400 names one of them)
ALONE = object()
#: what a POST's answer means for one of its rows: its answer, its failure, or ALONE
Outcome = GenerateAnswer | BaseException | object
#: a POST of these requests on a request thread's connection, one outcome a request in order; raises for a
#: failure of the whole exchange (every row gets it)
PostRequests = Callable[[PlainConnection, list[GenerateRequest]], list[Outcome]]
#: hands work to a request thread (ThreadedHTTP.submit_plain), and gives up on it (ThreadedHTTP.abort)
Submit = Callable[[Callable[[PlainConnection], list[Outcome]]], Future[list[Outcome]]]
Abort = Callable[[Future[list[Outcome]]], None]


class RowRequest:
    """One row's request: its answer comes in :attr:`future`; :meth:`cancel` gives it up."""

    def __init__(self, request: GenerateRequest, batches: PrefillBatches) -> None:
        self.request = request
        self.future: Future[GenerateAnswer] = Future()
        self.cancelled = False
        self.dumped = False  # the row's dump is complete (its worker says so): it waits only for its answer
        self.post: _Post | None = None  # the POST that carries it now
        self._batches = batches

    def cancel(self) -> None:
        self._batches.cancel(self)

    def others_waiting(self) -> bool:
        """Whether another row of its POST has neither its dump nor its answer: the server answers a POST once
        every row of it is dumped, so this row's answer cannot have come yet."""
        post = self.post
        rows = post.sent if post is not None and post.sent is not None else ()
        return any(not (row.dumped or row.cancelled or row.future.done()) for row in rows if row is not self)

    def resolve(self, outcome: Outcome) -> None:
        """Settle the row's future with ``outcome`` (an answer or an exception), unless it is settled already."""
        try:
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                assert isinstance(outcome, GenerateAnswer)
                self.future.set_result(outcome)
        except InvalidStateError:
            pass  # cancelled meanwhile


class _Post:
    """The rows of one POST: open to more until a request thread takes it up (``sent`` is then its rows)."""

    def __init__(self) -> None:
        self.rows: list[RowRequest] = []
        self.tokens = 0
        self.out = False  # handed to a request thread (it holds a slot, or is full)
        self.sent: list[RowRequest] | None = None
        self.exchange: Future[list[Outcome]] | None = None

    def add(self, row: RowRequest) -> None:
        self.rows.append(row)
        self.tokens += len(row.request.input_ids)
        row.post = self

    def abandoned(self) -> bool:
        """Sent, and every row it carries cancelled: nobody waits for its exchange."""
        return self.sent is not None and all(row.cancelled for row in self.sent)


class PrefillBatches:
    """Sends rows' prefills, several to a POST when rows wait for one (module docstring)."""

    def __init__(
        self, post: PostRequests, submit: Submit, abort: Abort, rows_per_request: int, max_tokens: int, max_posts: int
    ) -> None:
        if min(rows_per_request, max_tokens, max_posts) < 1:
            raise ValueError(f"rows_per_request, max_tokens and max_posts must be at least 1: {rows_per_request}, "
                             f"{max_tokens}, {max_posts}")  # fmt: skip
        self._post, self._submit, self._abort = post, submit, abort
        self.rows_per_request, self.max_tokens, self.max_posts = rows_per_request, max_tokens, max_posts
        self._lock = threading.Lock()
        self._open: _Post | None = None  # the POST rows join now: waiting for a slot, or out and not yet taken up
        self._posts_out = 0  # handed to a request thread and not yet settled

    def send(self, request: GenerateRequest) -> RowRequest:
        """Queue one row's request: into the open POST when it takes it, else a new one, handed to a thread at once
        while fewer than ``max_posts`` are out. A POST waiting for a slot goes as soon as one is free, or as soon as
        it takes no more rows (full, or the next row does not fit): waiting would not fill it further."""
        row = RowRequest(request, self)
        starts: list[_Post] = []
        with self._lock:
            post = self._open
            if post is None or not self._takes(post, request):
                if post is not None:
                    starts += self._close(post)
                post = self._open = _Post()
                if self._posts_out < self.max_posts:
                    starts += self._out(post)
            post.add(row)
            if len(post.rows) >= self.rows_per_request or post.tokens >= self.max_tokens:
                starts += self._close(post)
        for each in starts:
            self._start(each)
        return row

    def _takes(self, post: _Post, request: GenerateRequest) -> bool:
        return (
            len(post.rows) < self.rows_per_request
            and post.tokens + len(request.input_ids) <= self.max_tokens
            and post.rows[0].request.batch_key() == request.batch_key()
        )

    def _close(self, post: _Post) -> list[_Post]:
        """Under the lock: ``post`` takes no more rows; it goes out now if it was waiting (returned: start it)."""
        if self._open is post:
            self._open = None
        return [] if post.out else self._out(post)

    def _out(self, post: _Post) -> list[_Post]:
        """Under the lock: ``post`` holds a slot from now until it settles (returned: start it)."""
        post.out = True
        self._posts_out += 1
        return [post]

    def _start(self, post: _Post) -> None:
        exchange = self._submit(functools.partial(self._take_up, post))
        with self._lock:
            post.exchange = exchange
            abandoned = post.abandoned()
        exchange.add_done_callback(functools.partial(self._settle, post))
        if abandoned:
            self._abort(exchange)

    def _take_up(self, post: _Post, connection: PlainConnection) -> list[Outcome]:
        """On a request thread: close the POST to more rows and send the rows not cancelled."""
        with self._lock:
            self._close(post)
            post.sent = [row for row in post.rows if not row.cancelled]
        if not post.sent:
            return []
        return self._post(connection, [row.request for row in post.sent])

    def _settle(self, post: _Post, exchange: Future[list[Outcome]]) -> None:
        """The exchange is over: each row gets its outcome, or the exchange's failure."""
        with self._lock:
            self._close(post)
            if post.sent is None:  # never taken up (cancelled, or refused): every row it had
                post.sent = list(post.rows)
            rows = post.sent
        if exchange.cancelled():
            failure: BaseException | None = RequestsCancelled("the request was cancelled before it was sent")
        else:
            failure = exchange.exception()
        if failure is not None:
            for row in rows:
                row.resolve(_own_copy(failure) if len(rows) > 1 else failure)
        else:
            for row, outcome in zip(rows, exchange.result(), strict=True):
                if outcome is ALONE:
                    self._send_alone(row)
                else:
                    row.resolve(outcome)
        self._free_slot()

    def _free_slot(self) -> None:
        """A POST came back: the one waiting for a slot, if any, goes out."""
        with self._lock:
            self._posts_out -= 1
            post = self._open
            if post is None or post.out or self._posts_out >= self.max_posts:
                return
            self._out(post)
        self._start(post)

    def _send_alone(self, row: RowRequest) -> None:
        """Again, in a POST of its own, at once: its slot was the POST of several that the server refused."""
        post = _Post()
        with self._lock:
            if row.cancelled:
                return
            post.add(row)
            self._out(post)
        self._start(post)

    def cancel(self, row: RowRequest) -> None:
        """Give up one row's answer; the exchange is aborted once it carries no row still waiting."""
        with self._lock:
            if row.cancelled or row.future.done():
                return
            row.cancelled = True
            post = row.post
            assert post is not None
            exchange = post.exchange
            abandoned = post.abandoned()
        row.resolve(RequestsCancelled(f"the request of {row.request.rid} was cancelled"))
        if abandoned and exchange is not None:
            self._abort(exchange)


def _own_copy(failure: BaseException) -> BaseException:
    """A row's own copy of the exchange's failure: each row raises it on its own thread, and a raise extends the
    exception's traceback."""
    try:
        return copy.copy(failure)
    except Exception:  # an exception that does not copy (hsextract's all do): shared
        return failure
