"""The one way an HTTP handler runs a call on a batch model, whatever its wire format (`/v1/inference`,
`/v1/embeddings`, the Open Inference Protocol): where the call starts (its clock, its request id, its
trace), admission's one question, the inputs' futures awaited together, the inputs withdrawn when the
call ends without them (an error, the client gone), and the client that left counted.

Tracing wraps a route where the route is registered (`traced_route`), as idempotency does: a handler
never calls itself again to be traced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, cast

from aiohttp import web

from ..admission.admission import Admission
from ..admission.rate_limits import Identity
from ..messages import Batch, Client, PendingRequest, RequestState
from ..models.batch_model import BatchModel
from ..observability.outcomes import Call, Outcomes
from ..observability.tracing import Tracing
from .request_ids import RequestIds


def call_start(ids: RequestIds, headers: Mapping[str, str]) -> Call:
    """A call starting now, with the client's `X-Request-ID` (or `Idempotency-Key`) if sane, else a new id."""
    return Call(time.monotonic(), ids.pick(headers.get("X-Request-ID") or headers.get("Idempotency-Key")))


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
        call.trace = tracing.begin(request.headers, call.started, request)
        if call.trace is None:
            return await handler(request, call)
        return await _answer_traced(tracing, call, partial(handler, request))

    return route


async def traced(tracing: Tracing, request: web.BaseRequest, call: Call,
                 answer: Callable[[Call], Awaitable[web.StreamResponse]], route: str | None = None) -> web.StreamResponse:
    """`answer(call)`, with the call's trace begun (sampled or not) as it starts, and its span written
    with the status it answered (499: the client left first). `route`: the span's route (default: the
    request's path)."""
    call.trace = tracing.begin(request.headers, call.started, route or request)
    if call.trace is None:
        return await answer(call)
    return await _answer_traced(tracing, call, answer)


async def _answer_traced(tracing: Tracing, call: Call,
                         answer: Callable[[Call], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    status = 499
    try:
        response = await answer(call)
        status = response.status
        return response
    finally:
        tracing.end(call.trace, call.request_id, status)  # type: ignore[arg-type]


class BatchCalls:
    """Admission and the answers of one call's inputs (see the module docstring)."""

    def __init__(self, admission: Admission, outcomes: Outcomes) -> None:
        self.admission = admission
        self.outcomes = outcomes

    def admit(self, model: BatchModel, call: Call, values: Sequence[Any], who: Identity, timeout_ms: int | None,
              use_cache: bool) -> None:
        """The call's inputs taken by the model (`call.requests`), all or none (admission's refusal raised
        otherwise)."""
        call.requests = requests = self.admission.admit(model, call.request_id, values, who, timeout_ms, use_cache,
                                                        call.client)
        if call.trace is not None:
            call.trace.admitted(requests, model.name, model.version, who.tier, who.tenant)

    async def answers(self, model: BatchModel, call: Call) -> list[Any]:
        """The outputs of the call's requests, in order. Raises the first error one of them ended with;
        whatever did not finish is withdrawn (never computed if still queued), and a client that left
        is counted before the cancellation goes on."""
        requests = call.requests
        try:
            if len(requests) == 1:  # (one input, the usual case: its own future, no gathering)
                return [await requests[0].future]
            return list(await asyncio.gather(*(request.future for request in requests)))
        except asyncio.CancelledError:
            self.outcomes.record(call, 499, "CLIENT_DISCONNECTED")
            raise
        finally:
            withdraw_unanswered(model, requests)


def call_timing(items: Sequence[PendingRequest], held_s: float) -> str:
    """A multi-input call's `Server-Timing`: how long the server held it, the queue and compute of its
    input answered last (the one its answer waited for; an input answered from the cache or another's
    computation has neither), and how many of its inputs the result cache answered. (The largest queue
    and the largest compute of any of its inputs, as it once said, could come from two batches of a
    call split over them and add up to more than the call's total.)"""
    computed = [item for item in items if item.batch is not None]
    timing = f"total;dur={held_s * 1000:.3f}"
    if computed:
        last = max(computed, key=lambda item: item.batch.finished_at)  # type: ignore[union-attr]
        batch = cast(Batch, last.batch)
        timing += f", queue;dur={batch.queue_s(last) * 1000:.3f}, compute;dur={batch.compute_s * 1000:.3f}"
    hits = sum(1 for item in items if item.state is RequestState.CACHED)
    if hits:  # (as /v1/inference marks its own: the inputs answered from the result cache)
        timing += f', cache;desc="hit {hits} of {len(items)}"'
    return timing


def cache_allowed(headers: Mapping[str, str]) -> bool:
    """A client's `Cache-Control: no-cache` (or `no-store`) asks for a fresh computation."""
    control = headers.get("Cache-Control")
    if control is None:
        return True
    control = control.lower()
    return "no-cache" not in control and "no-store" not in control


def withdraw_unanswered(model: BatchModel | None, items: list[PendingRequest]) -> None:
    """The rest of a call that failed or was given up: never computed if still waiting (a cancelled
    gather has cancelled their futures already, so a cancelled future counts as unanswered)."""
    for item in items:
        if not item.future.done() or item.future.cancelled():
            model.abandon(item)  # type: ignore[union-attr]
