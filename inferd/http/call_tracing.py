"""An HTTP call's connection and trace, beside the call layer's runner (`calls.batch_calls`): the
connection a request came on (the batcher's echo), and tracing, which wraps a route where the route
is registered (`traced_route`), as idempotency does: a handler never calls itself again to be traced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

from aiohttp import web

from ..calls.batch_calls import call_start
from ..calls.request_ids import RequestIds
from ..messages import Client
from ..observability.outcomes import Call
from ..observability.tracing import RequestTrace, Tracing


def client_of(request: web.BaseRequest) -> Client | None:
    """The connection a request came on, as the batcher's echo knows it (`connections.GuardedConnection`)."""
    return getattr(request.protocol, "client", None)


class CallHandler(Protocol):
    """A route that may be handed the call's start (when a trace or the fast path began it)."""

    def __call__(self, request: web.BaseRequest, call: Call | None = None, /) -> Awaitable[web.StreamResponse]: ...


def traced_route(tracing: Tracing, ids: RequestIds, handler: CallHandler) -> Callable[
        [web.BaseRequest], Awaitable[web.StreamResponse]]:
    """`handler` (a route's) with a trace: see `traced`. An unsampled call (99 in 100 at the default
    rate) goes straight to the handler: the draw, and no coroutine frame of tracing's own."""
    async def route(request: web.BaseRequest) -> web.StreamResponse:
        call = call_start(ids, request.headers)
        call.trace = trace = tracing.begin(request.headers, call.started, request)
        if trace is None:
            return await handler(request, call)
        return await _answer_traced(tracing, trace, call, partial(handler, request))

    return route


async def traced(tracing: Tracing, request: web.BaseRequest, call: Call,
                 answer: Callable[[Call], Awaitable[web.StreamResponse]], route: str | None = None) -> web.StreamResponse:
    """`answer(call)`, with the call's trace begun (sampled or not) as it starts, and its span written
    with the status it answered (499: the client left first). `route`: the span's route (default: the
    request's path)."""
    call.trace = trace = tracing.begin(request.headers, call.started, route or request)
    if trace is None:
        return await answer(call)
    return await _answer_traced(tracing, trace, call, answer)


async def _answer_traced(tracing: Tracing, trace: RequestTrace, call: Call,
                         answer: Callable[[Call], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    status = 499
    try:
        response = await answer(call)
        status = response.status
        return response
    finally:
        tracing.end(trace, call.request_id, status)
