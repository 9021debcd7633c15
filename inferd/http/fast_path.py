"""Inference answered from the connection itself: the common request, without the per-request
machinery of aiohttp's server around it.

Why: around each request aiohttp makes a task, a request object, a writer and a response object, with
the awaits between them. Without them an S2 request costs ~252,000 instructions instead of ~295,000
(callgrind, real sockets), S2's throughput is 1.09-1.27 of what it was at 100 and 400 clients and S9's
1.05-1.21 (`benchmarks/results/callgrind_request.md`, `request_path_fast*.md`); an embedding route's
request 14-23% less server CPU (`route_floor.md`). At 100 closed-loop clients each batch waits for the
previous one's answers to go out and the next requests to come in, so that CPU is the turnaround
(issue 27).

What it takes: `POST /v1/inference` (or `/api/inference`) to a batch model; every route whose call
holds several inputs (`dialects`: OpenAI's `/v1/embeddings` and `/v1/classify`, TEI's `/embed`,
`/predict`, `/rerank` and `POST /`, Cohere's `/v2/embed` and `/v1/rerank`); KServe v2's
`/v2/models/{name}[/versions/{v}]/infer` once its model is found and its caller known (else the usual
way answers it, as it did). The whole body in with its headers or in the next read (the connection
waits up to `BODY_GRACE_S` for it, then hands the request on), on a connection with nothing else in
hand; no query string, `Idempotency-Key`, `Expect`, `Content-Encoding` or image body. Everything else,
and anything it is unsure of, goes the usual way (`api.HttpApi.handle`). The call runs through the
handler's own steps (`InferenceApi.identify / route / admit / answered / refused`; `identify / take /
answered_many / refused` for a call of several inputs; `OpenInferenceApi.take / answered / refused`):
the same admission, errors, records, trace and headers. Each input's future calls back when it
resolves (a call of several is answered with its last, or refused with its first error and the rest
withdrawn, as the handler's gather does); a client that goes away has its inputs withdrawn as a
cancelled handler's are. `[server] fast_path = false` turns it off.

Why one module: taking a request off the connection, and answering it there, is one protocol with the
connection (`Connection`, `InFlight`); the three kinds of call differ only in which handler steps it
runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from aiohttp.http import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from multidict import CIMultiDictProxy

from ..calls.batch_calls import call_start, withdraw_unanswered
from ..errors import InferdError, InternalError, PayloadTooLarge, describe
from ..lifecycle import Lifecycle
from ..messages import Client
from ..observability.tracing import Tracing
from ..wire.dialects import Dialect
from .inference import CALL_PATHS, TEI_ROOT, InferenceApi, ManyInputs, OneInput
from .open_inference import TRACED_ROUTE, OpenInferenceApi, V2Infer
from .responses import answer_bytes

log = logging.getLogger("inferd.http")

Unread = tuple[RawRequestMessage, StreamReader]  # a request handed back to go the usual way, its body unread again
BODY_GRACE_S = 0.05  # how long a connection holds a request whose body is on its way before the usual way takes it
_GO_THE_USUAL_WAY = ("Idempotency-Key", "Expect", "Content-Encoding")


class Connection(Protocol):
    """What the fast path needs of a connection (`connections.GuardedConnection`)."""

    fast_flight: InFlight | None  # the request it is answering, if any
    client: Client  # the connection, as the batcher's closed-loop echo sees it

    def fast_answered(self, data: bytes, keep_alive: bool) -> None:
        """Write the answer; the connection is idle again, or closes."""


class InFlight:
    """A request the fast path took, until its answer is written or its client goes away."""

    __slots__ = ("path", "one", "connection", "keep_alive", "unanswered")

    def __init__(self, path: FastPath, one: OneInput | ManyInputs | V2Infer, connection: Connection,
                 keep_alive: bool) -> None:
        self.path = path
        self.one = one
        self.connection = connection
        self.keep_alive = keep_alive  # the client's (HTTP/1.0, `Connection: close`), before the answer's own
        self.unanswered = 1  # its inputs whose futures have not called back yet

    def __call__(self, future: asyncio.Future) -> None:
        """Its future's done-callback. (Held by the future only until it runs: nothing here holds the
        request in a cycle once it is answered, and reference counting alone frees it.)"""
        self.path.resolved(self, future)


class FastPath:
    """Takes the requests it can answer from a connection's `data_received` (see the module docstring)."""

    def __init__(self, inference: InferenceApi, open_inference: OpenInferenceApi, lifecycle: Lifecycle,
                 tracing: Tracing | None) -> None:
        self.inference = inference
        self.open_inference = open_inference
        self.lifecycle = lifecycle
        self.tracing = tracing
        self.max_body_bytes = inference.body.max_bytes
        self.taken = 0  # requests it took to the end (answered, or their client left)

    def takes(self, message: RawRequestMessage, payload: StreamReader) -> bool:
        """Whether a parsed request is one it answers: checked before it leaves aiohttp's queue."""
        if message.method != "POST" or not _taken_path(message.path) or message.upgrade:
            return False
        if payload is EMPTY_PAYLOAD or not payload.is_eof() or payload.exception() is not None:
            return False
        return self._headers_allow(message.headers)

    def waits_for_body(self, message: RawRequestMessage, payload: StreamReader) -> bool:
        """Whether it would take this request once its body is in: announced (within the size limit) and
        not all come. Many clients write the headers and the body apart (aiohttp's, for one)."""
        if message.method != "POST" or not _taken_path(message.path) or message.upgrade:
            return False
        if payload is EMPTY_PAYLOAD or payload.is_eof() or payload.exception() is not None:
            return False
        length = message.headers.get("Content-Length")
        return length is not None and length.isdigit() and int(length) <= self.max_body_bytes and \
            self._headers_allow(message.headers)

    @staticmethod
    def _headers_allow(headers: CIMultiDictProxy[str]) -> bool:
        for name in _GO_THE_USUAL_WAY:
            if name in headers:
                return False
        return headers.get("Content-Type", "")[:6] != "image/"

    def start(self, connection: Connection, message: RawRequestMessage, payload: StreamReader) -> Unread | None:
        """Answer a request `takes` accepted: at once (a refusal), or when its future resolves (the
        connection's `fast_flight` meanwhile); None. Or it is not one after all (it names a generation
        model): nothing was done, and the request (its body unread again) is returned to go the usual way."""
        if message.path not in CALL_PATHS:
            return self._start_v2(connection, message, payload)
        dialect = CALL_PATHS[message.path]
        if dialect is not None:
            if message.path == TEI_ROOT:
                dialect = self.inference.tei_root_dialect()
            self._start_many(connection, message, payload, dialect)
            return None
        inference, headers = self.inference, message.headers
        one = OneInput(call_start(inference.ids, headers))
        one.call.client = connection.client
        # In flight from here: reading the body can call the connection's `data_received` again (aiohttp
        # resumes its parser), which must find a request in hand.
        connection.fast_flight = flight = InFlight(self, one, connection, not message.should_close)
        self.lifecycle.enter()
        drawn = self.tracing is None  # (whether its trace was drawn: once, and not for a request handed on)
        try:
            inference.identify(one, headers)
            body = whole_body(payload)
            if len(body) > self.max_body_bytes:
                raise PayloadTooLarge(f"body exceeds {self.max_body_bytes} bytes")
            if inference.route(one, body, headers, _NO_QUERY) is not None:  # a generation model's: its handler
                connection.fast_flight = None  # streams (and draws the trace), from the body as it came
                self.lifecycle.leave()
                unread = StreamReader(connection, _READ_LIMIT, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
                unread.feed_data(body)
                unread.feed_eof()
                return message, unread
            if not drawn:
                drawn = self._trace(one, headers, message.path)
            inference.admit(one, headers)
        except InferdError as error:
            if not drawn:  # (a refusal is traced as the handler's is: from the call's start)
                self._trace(one, headers, message.path)
            self._finish(flight, *self._refusal(flight, error))
            return None
        except Exception as exc:  # noqa: BLE001 - a bug: this request's 500, as aiohttp answers a handler's
            log.error("request %s failed: %s", one.call.request_id, describe(exc), exc_info=exc)
            if not drawn:
                self._trace(one, headers, message.path)
            self._finish(flight, *self._refusal(flight, InternalError("internal error (logged with this request id)")))
            return None
        except BaseException:
            connection.fast_flight = None
            self.lifecycle.leave()
            raise
        one.call.requests[0].future.add_done_callback(flight)
        return None

    def _start_many(self, connection: Connection, message: RawRequestMessage, payload: StreamReader, dialect: Dialect) -> None:
        """`start` for a call of several inputs: traced from its start, as the handler's route is."""
        inference, headers = self.inference, message.headers
        many = ManyInputs(call_start(inference.ids, headers), dialect)
        self._start_call(connection, message, payload, many, lambda body: inference.take(many, body, headers), message.path,
                         lambda: inference.identify(many, headers))

    def _start_v2(self, connection: Connection, message: RawRequestMessage, payload: StreamReader) -> Unread | None:
        """`start` for KServe v2's infer, once its model is found and its caller known: else nothing was
        done, and the request goes the usual way (whose answer, a 404 or 401 before the call starts, is
        neither counted in flight nor recorded)."""
        api, headers = self.open_inference, message.headers
        parts = message.path.split("/")[3:]  # (after "", "v2", "models"; the path ends in /infer)
        name, version = parts[0], parts[2] if len(parts) == 4 and parts[1] == "versions" else None
        if len(parts) not in (2, 4) or len(parts) == 4 and version is None or "@" in name:
            return message, payload
        try:
            who = api.admission.identify(headers)
            model = api.models.route(name, version)
        except InferdError:
            return message, payload
        if model is None:
            return message, payload
        infer = V2Infer(api.started(model, api.ids.pick(headers.get("X-Request-ID"))), model, who)
        self._start_call(connection, message, payload, infer, lambda body: api.take(infer, body, headers), TRACED_ROUTE)
        return None

    def _start_call(self, connection: Connection, message: RawRequestMessage, payload: StreamReader, state: ManyInputs | V2Infer,
                    take: Callable[[bytes], object], route: str, identify: Callable[[], None] | None = None) -> None:
        """In flight from here: traced (`route`), the caller identified (where not yet: `identify`), the
        body read, `take(body)` admits its inputs; then answered when the last of their futures calls
        back, or refused at once."""
        state.call.client = connection.client
        connection.fast_flight = flight = InFlight(self, state, connection, not message.should_close)
        self.lifecycle.enter()
        try:
            if self.tracing is not None:
                self._trace(state, message.headers, route)
            if identify is not None:
                identify()
            body = whole_body(payload)
            if len(body) > self.max_body_bytes:
                raise PayloadTooLarge(f"body exceeds {self.max_body_bytes} bytes")
            take(body)
        except InferdError as error:
            self._finish(flight, *self._refusal(flight, error))
            return
        except Exception as exc:  # noqa: BLE001 - a bug: this request's 500, as aiohttp answers a handler's
            log.error("request %s failed: %s", state.call.request_id, describe(exc), exc_info=exc)
            self._finish(flight, *self._refusal(flight, InternalError("internal error (logged with this request id)")))
            return
        except BaseException:
            connection.fast_flight = None
            self.lifecycle.leave()
            raise
        requests = state.call.requests
        if not requests:  # (every dialect refuses an empty call before this; answered all the same, never left waiting)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            done.add_done_callback(flight)
            return
        flight.unanswered = len(requests)
        for request in requests:
            request.future.add_done_callback(flight)

    def _trace(self, one: OneInput | ManyInputs | V2Infer, headers: CIMultiDictProxy[str], path: str) -> bool:
        """Draw the call's trace (`Tracing.begin`), from its start, once it is known to be a batch model's
        call or refused: a generation model's handler draws its own, and a second draw would take a
        client's sampled `traceparent` twice from `max_client_traced_per_s`. Returns True: drawn."""
        tracing = self.tracing
        assert tracing is not None  # (drawn only where the server traces)
        one.call.trace = tracing.begin(headers, one.call.started, path)
        return True

    def resolved(self, flight: InFlight, future: asyncio.Future) -> None:
        """The request's future is done (on the loop): its answer goes out, unless its client left."""
        if flight.connection.fast_flight is not flight:
            return  # the client went away first (`client_gone` recorded it)
        one = flight.one
        try:
            if future.cancelled():  # (only a client that left cancels it, and that was seen above)
                raise InternalError("the request was withdrawn while its client still waited")
            error = future.exception()
            if error is None:
                if type(one) is OneInput:
                    data = answer_bytes(200, *self.inference.answered(one, future.result()), flight.keep_alive)
                else:
                    flight.unanswered -= 1
                    if flight.unanswered:
                        return  # (answered with the last of its inputs)
                    outputs = [r.future.result() for r in one.call.requests]
                    if type(one) is ManyInputs:
                        data = answer_bytes(200, *self.inference.answered_many(one, outputs), flight.keep_alive)
                    else:
                        assert type(one) is V2Infer
                        body, extra, content_type = self.open_inference.answered(one, outputs)
                        data = answer_bytes(200, body, extra, flight.keep_alive, content_type)
        except InferdError as raised:
            error = raised
        except Exception as exc:  # noqa: BLE001 - a bug (e.g. an output JSON cannot hold): this request's 500
            error = exc
        if error is None:
            self._finish(flight, 200, data, flight.keep_alive)
            return
        if not isinstance(error, InferdError):
            log.error("request %s failed: %s", one.call.request_id, describe(error), exc_info=error)
            error = InternalError("internal error (logged with this request id)")
        self._finish(flight, *self._refusal(flight, error))
        withdraw_unanswered(one.model, one.call.requests)  # (a call of several: the rest, never computed)

    def _refusal(self, flight: InFlight, error: InferdError) -> tuple[int, bytes, bool]:
        one = flight.one
        response = self.open_inference.refused(one, error) if isinstance(one, V2Infer) else self.inference.refused(one, error)
        keep_alive = flight.keep_alive and not response.closes
        return error.status, response.encoded(keep_alive), keep_alive

    def _finish(self, flight: InFlight, status: int, data: bytes, keep_alive: bool) -> None:
        one = flight.one
        self.taken += 1
        try:
            trace = one.call.trace
            if trace is not None and self.tracing is not None:  # (a trace is drawn only where the server traces)
                self.tracing.end(trace, one.call.request_id, status)
            flight.connection.fast_answered(data, keep_alive)
        finally:
            self.lifecycle.leave()

    def client_gone(self, flight: InFlight) -> None:
        """Its connection was lost before the answer: counted as a cancelled handler's (499), its input
        withdrawn."""
        one = flight.one
        self.taken += 1
        try:
            self.inference.outcomes.record(one.call, 499, "CLIENT_DISCONNECTED")
            withdraw_unanswered(one.model, one.call.requests)
            trace = one.call.trace
            if trace is not None and self.tracing is not None:
                self.tracing.end(trace, one.call.request_id, 499)
        finally:
            self.lifecycle.leave()


def _taken_path(path: str) -> bool:
    return path in CALL_PATHS or path[:11] == "/v2/models/" and path[-6:] == "/infer"


_READ_LIMIT = 2**16  # (aiohttp's own for a request's body)
_NO_QUERY: dict[str, str] = {}  # (a request with a query string goes the usual way)


def whole_body(payload: StreamReader) -> bytes:
    """The body of a request aiohttp's parser has finished (`payload.is_eof()`). Why not `read_nowait`:
    it resumes the connection's reading after it reads, and resuming re-enters the connection's
    `data_received` with no data, a second pass through it and aiohttp's parser for every request
    (6,000-9,000 of ~234,000 instructions per S2 request, benchmarks/results/inprocess_request.md). That resumption is
    needed only where the body paused the parser, past twice `_READ_LIMIT`: from `_READ_LIMIT` up (a
    margin), a body is read the usual way."""
    chunks = payload._buffer
    if payload._size >= _READ_LIMIT or payload._buffer_offset:
        return payload.read_nowait()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
