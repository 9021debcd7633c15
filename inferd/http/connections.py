"""Connections: how many may be open, and how long a client may take over a request's headers.

aiohttp closes a connection that idles between requests (`keepalive_timeout_s`), but not one part-way
through its headers, and takes as many connections as the process has file descriptors: a few
thousand silent or trickling clients then hold every descriptor, and every new client is refused,
health checks included. Here each connection gets `header_timeout_s` from its first byte (or its
opening, for a client that sends nothing) to the end of its headers, else a 408 and it closes. Past
`max_connections - connection_reserve` open connections a new one may only ask `/healthz` or
`/readyz` (anything else: 503 and close), so a load balancer still sees how the host is doing; past
`max_connections` it is closed at once. (A trickling body is the handlers' business: `body_timeout_s`,
`body_reader`.) A parsed request is offered to the fast path (`fast_path`) when nothing else is in
hand; what it leaves goes to aiohttp's request loop, in order.

Why one module: everything that reads or sets the state of aiohttp's connection (its request loop's
waiter and queue, its keep-alive timer, its parser) is here, where the hand-offs between aiohttp's loop,
the fast path and the clocks can be read together.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo

from ..calls.request_ids import RequestIds
from ..errors import InferdError, InternalError, MalformedRequest, PayloadTooLarge, describe
from ..messages import Client
from ..wire.json_values import dumps
from .connection_reserve import ConnectionLimits, health_only
from .fast_path import BODY_GRACE_S, FastPath, InFlight
from .responses import error_response, openai_path

_parse = RequestHandler.data_received  # (called directly: super() in a method called per request costs)
log = logging.getLogger("inferd.http")


class GuardedServer(web.Server):
    """aiohttp's low-level server, with a count of open connections and a clock on headers."""

    def __init__(self, handler: Any, *, limits: ConnectionLimits, ids: RequestIds,
                 on_error: Callable[[str, InferdError], object], fast_path: FastPath | None = None, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.fast_path = fast_path  # answers the common request from `data_received` (`fast_path`)
        self.limits = limits
        self.ids = ids
        self.on_error = on_error  # counts an answer made here (a request aiohttp could not parse, a bug)
        self.open = 0
        self.refused = 0  # connections closed at once: max_connections were open
        self.reserved = 0  # requests refused on a reserved connection (not a health check)
        self.header_timeouts = 0
        # Connections whose headers are on the clock, with their deadlines. One sweep a fraction of the
        # timeout apart finds the late ones: cheaper than a timer per request (a request's headers
        # nearly always arrive in one piece, and its connection never gets on the clock at all).
        self.awaiting_headers: dict[GuardedConnection, float] = {}
        self._sweeper: asyncio.Task | None = None

    def __call__(self) -> RequestHandler:
        if self._sweeper is None:
            self._sweeper = self._loop.create_task(self._sweep(), name="header-timeouts")
        return GuardedConnection(self, loop=self._loop, **self._kwargs)

    async def _sweep(self) -> None:
        period = min(1.0, self.limits.header_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            late = [conn for conn, deadline in self.awaiting_headers.items() if deadline <= now]
            for conn in late:
                conn.headers_too_slow()

    async def shutdown(self, timeout: float | None = None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        await super().shutdown(timeout)

    def stats(self) -> dict[str, int]:
        return {"open": self.open, "max": self.limits.max_connections, "refused": self.refused,
                "refused_requests_in_reserve": self.reserved, "header_timeouts": self.header_timeouts}


class GuardedConnection(RequestHandler):
    """One client connection under the server's limits."""

    __slots__ = ("_on_clock", "_server", "_fast", "fast_flight", "_held_for_body", "_in_hand", "_make_request",
                 "_behind_fast", "client")

    def __init__(self, server: GuardedServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._server = server
        self._on_clock = False  # in the server's awaiting_headers
        self._fast = server.fast_path
        self.fast_flight: InFlight | None = None  # the request the fast path is answering
        self._held_for_body: asyncio.TimerHandle | None = None  # a request held for its body's next read
        self._in_hand = False  # aiohttp's loop has a request, from its queue until its answer is out
        self._behind_fast: deque[Any] = deque()  # requests that came after the fast path's, until it is answered
        self.client = Client()  # this connection as the batcher's closed-loop echo sees it
        self._make_request = self._request_factory
        self._request_factory = self._request_in_hand

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        server, limits = self._server, self._server.limits
        server.open += 1
        if server.open > limits.max_connections:
            server.refused += 1
            self.force_close()
            return
        if server.open > limits.max_connections - limits.connection_reserve:
            self._request_handler = partial(health_only, server)  # this connection holds a reserved descriptor
            self._fast = None  # (nor does the fast path answer it)
        self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        held = self._held_for_body
        if held is not None:  # (its body, or more of it, is what came: taken below, or handed on)
            held.cancel()
            self._held_for_body = None
        waiter = self._waiter  # (aiohttp's request loop waits on it for the next parsed request)
        if waiter is not None and waiter.done():
            waiter = None  # (woken already: aiohttp's loop takes what is queued)
        # No request in hand: these bytes begin the next one. (aiohttp's loop may not be waiting yet: between
        # its answer going out and its next wait, a quick client's next request is already here.)
        idle = self.fast_flight is None and (waiter is not None or not self._in_hand and self._waiter is None)
        if self._fast is None or waiter is None:
            _parse(self, data)
        else:  # the loop is woken below, for what the fast path does not take
            self._waiter = None
            try:
                _parse(self, data)
            finally:
                self._waiter = waiter
        messages = self._messages
        if messages:  # a request's headers are in (or the parser refused what came)
            if self._on_clock:
                self._stop_header_clock()
            if type(messages[-1][0]) is _ErrInfo and self._current_request is not None:
                self._body_refused(messages)
            if self.fast_flight is not None:  # pipelined behind the fast path's request: out of aiohttp's
                behind = self._behind_fast  # sight until it is answered (its loop may be between requests,
                behind.extend(messages)  # not waiting, and would answer these first)
                messages.clear()
                if len(behind) >= self._max_msg_queue_size and not self._buffer_paused:
                    # aiohttp's own bound on a connection's parsed requests, which it no longer sees: reading
                    # pauses until its loop has taken them (it resumes as it drains them). Unbounded, a client
                    # that pipelined 100 KB requests and read no answer had 63,000 of them read (+211 MB).
                    self._pause_reading_for_buffer()
                return
            if not idle or self._fast is None:
                self._wake(waiter)
                return  # (aiohttp's loop has a request in hand, or was woken by the parse)
            if len(messages) == 1:
                if self._fast_path_took(messages):
                    return  # answered, or answered when its future resolves
                if held is None and self._hold_for_body(messages[0]):
                    return  # its body comes in the next read (held once: then it goes the usual way)
            self._wake(waiter)  # (None between aiohttp's answer and its next wait: it takes the queue then)
        elif idle and not self._on_clock:
            self._start_header_clock()

    def _fast_path_took(self, messages: Any) -> bool:
        message, payload = messages[0]
        fast = self._fast
        assert fast is not None
        if type(message) is _ErrInfo or not fast.takes(message, payload):
            return False
        messages.popleft()
        back = fast.start(self, message, payload)
        if back is not None:  # (and what came meanwhile, as reading its body resumed the parser)
            messages.append(back)
            messages.extend(self._behind_fast)
            self._behind_fast.clear()
            return False
        self._parser.message_consumed()  # type: ignore[union-attr]
        self._manager.requests_count += 1  # type: ignore[union-attr]
        return True

    def _request_in_hand(self, *args: Any) -> web.BaseRequest:
        """aiohttp's loop took a request from its queue (its request factory, wrapped)."""
        self._in_hand = True
        return self._make_request(*args)  # type: ignore[misc]  # (aiohttp types its factory Optional: set by now)

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._in_hand = False  # its answer is out

    def _process_keepalive(self) -> None:
        if self.fast_flight is not None:  # (a request being answered is not idleness: rearmed once it is out)
            self._keepalive_handle = None
            return
        super()._process_keepalive()

    def _hold_for_body(self, entry: Any) -> bool:
        message, payload = entry
        if type(message) is _ErrInfo or not self._fast.waits_for_body(message, payload):  # type: ignore[union-attr]
            return False
        self._held_for_body = self._loop.call_later(BODY_GRACE_S, self._stop_holding)
        return True

    def _stop_holding(self) -> None:
        """The body did not come in time: aiohttp's loop takes the request (and its body timeout)."""
        self._held_for_body = None
        if self._messages:
            self._wake(self._waiter)

    def fast_answered(self, data: bytes, keep_alive: bool) -> None:
        """The fast path's answer: written whole; then the connection is idle again (aiohttp's keep-alive
        timer rearmed as after its own answers), or closed."""
        self.fast_flight = None
        transport = self.transport
        if transport is None:
            return
        transport.write(data)
        if not keep_alive:
            self.force_close()  # (the transport sends what was written, then closes)
            return
        self._keepalive = True
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(self._next_keepalive_close_time, self._process_keepalive)
        if self._behind_fast:  # pipelined behind it: aiohttp's loop answers those, in order
            self._messages.extend(self._behind_fast)
            self._behind_fast.clear()
            self._wake(self._waiter)

    @staticmethod
    def _wake(waiter: asyncio.Future | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _body_refused(self, messages: Any) -> None:
        """The parser refused bytes of the body a handler is reading now (a malformed chunk): aiohttp
        queues its refusal as a next message, and the handler would wait for the rest of its body until
        `body_timeout_s`. Its read fails now instead (a 400 that closes the connection)."""
        content = self._current_request.content  # type: ignore[union-attr]
        if content.is_eof():
            return
        refusal = messages.pop()[0]
        content.set_exception(RequestPayloadError(f"malformed body: {refusal.message}"))

    def eof_received(self) -> bool:  # type: ignore[override]  # (asyncio's protocols may return True: aiohttp says None)
        """The client's end of input. A client that closes and one that only half-closes after sending
        look the same here, so by default (as nginx and Go's server do) it has gone away: its queued work
        is withdrawn. With `answer_half_closed` it still gets its answer, then the connection closes."""
        if not self._server.limits.answer_half_closed:
            return False
        flight = self.fast_flight
        busy = self._waiter is None or bool(self._messages) or flight is not None  # a request in hand, or queued
        if flight is not None:
            flight.keep_alive = False
        elif busy:
            self.keep_alive(False)
        return busy

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """What aiohttp answers itself (a request it cannot parse, a handler that raised) in the shape of
        every other answer: JSON, a stable code, a request id, counted, and the connection closed."""
        if request.writer.output_size > 0:
            raise ConnectionError("the response had begun; the connection is dropped")
        if status >= 500:
            log.error("error handling %s %s: %s", request.method, request.raw_path, describe(exc) if exc else message,
                      exc_info=exc)
            error: InferdError = InternalError("internal error (logged with this request id)")
        elif status == 413:
            error = PayloadTooLarge(" ".join(str(message or exc).split()))
        else:
            error = MalformedRequest(" ".join(str(message or exc or "malformed HTTP request").split())[:300])
        request_id = self._server.ids.pick(request.headers.get("X-Request-ID"))
        self._server.on_error(request_id, error)
        return error_response(error, request_id, close=True, openai=openai_path(request.raw_path))

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._on_clock:
            self._stop_header_clock()
        self._server.open -= 1
        if self._held_for_body is not None:
            self._held_for_body.cancel()
        flight = self.fast_flight
        if flight is not None:
            self.fast_flight = None
            self._fast.client_gone(flight)  # type: ignore[union-attr]
        super().connection_lost(exc)

    def _start_header_clock(self) -> None:
        self._on_clock = True
        self._server.awaiting_headers[self] = self._loop.time() + self._server.limits.header_timeout_s

    def _stop_header_clock(self) -> None:
        self._on_clock = False
        self._server.awaiting_headers.pop(self, None)

    def headers_too_slow(self) -> None:
        """The sweep found this connection past its header deadline: 408 and close."""
        self._stop_header_clock()
        transport = self.transport
        if self._messages or transport is None or transport.is_closing():
            return
        self._server.header_timeouts += 1
        seconds = self._server.limits.header_timeout_s
        body = dumps({"error": "REQUEST_TIMEOUT", "message": f"request headers not received within {seconds:g} s",
                      "request_id": self._server.ids.pick(None)})
        transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.force_close()
