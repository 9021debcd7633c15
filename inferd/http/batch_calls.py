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
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from aiohttp import web

from ..admission.admission import Admission
from ..admission.rate_limits import Identity
from ..messages import PendingRequest, RequestState
from ..models.batch_model import BatchModel
from ..observability.outcomes import Outcomes
from ..observability.tracing import RequestTrace, Tracing
from .request_ids import RequestIds


@dataclass(slots=True)
class CallStart:
    """Where a call started: the clock every stage is measured from, its request id, its trace if sampled."""

    started: float
    request_id: str
    trace: RequestTrace | None = None


def call_start(ids: RequestIds, headers: Mapping[str, str]) -> CallStart:
    """A call starting now, with the client's `X-Request-ID` (or `Idempotency-Key`) if sane, else a new id."""
    return CallStart(time.monotonic(), ids.pick(headers.get("X-Request-ID") or headers.get("Idempotency-Key")))


class CallHandler(Protocol):
    """A route that may be handed the call's start (when a trace or the fast path began it)."""

    def __call__(self, request: web.BaseRequest, start: CallStart | None = None, /) -> Awaitable[web.StreamResponse]: ...


def traced_route(tracing: Tracing, ids: RequestIds, handler: CallHandler) -> Callable[
        [web.BaseRequest], Awaitable[web.StreamResponse]]:
    """`handler` (a route's) with a trace: see `traced`. An unsampled call (99 in 100 at the default
    rate) goes straight to the handler: the draw, and no coroutine frame of tracing's own."""
    async def route(request: web.BaseRequest) -> web.StreamResponse:
        start = call_start(ids, request.headers)
        start.trace = tracing.begin(request.headers, start.started, request)
        if start.trace is None:
            return await handler(request, start)
        return await _answer_traced(tracing, start, partial(handler, request))

    return route


async def traced(tracing: Tracing, request: web.BaseRequest, start: CallStart,
                 answer: Callable[[CallStart], Awaitable[web.StreamResponse]], route: str | None = None) -> web.StreamResponse:
    """`answer(start)`, with the call's trace begun (sampled or not) as it starts, and its span written
    with the status it answered (499: the client left first). `route`: the span's route (default: the
    request's path)."""
    start.trace = tracing.begin(request.headers, start.started, route or request)
    if start.trace is None:
        return await answer(start)
    return await _answer_traced(tracing, start, answer)


async def _answer_traced(tracing: Tracing, start: CallStart,
                         answer: Callable[[CallStart], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    status = 499
    try:
        response = await answer(start)
        status = response.status
        return response
    finally:
        tracing.end(start.trace, start.request_id, status)  # type: ignore[arg-type]


class BatchCalls:
    """Admission and the answers of one call's inputs (see the module docstring)."""

    def __init__(self, admission: Admission, outcomes: Outcomes) -> None:
        self.admission = admission
        self.outcomes = outcomes

    def admit(self, model: BatchModel, start: CallStart, values: Sequence[Any], who: Identity, timeout_ms: int | None,
              use_cache: bool) -> list[PendingRequest]:
        """The call's inputs taken by the model, all or none (admission's refusal raised otherwise)."""
        items = self.admission.admit(model, start.request_id, values, who, timeout_ms, use_cache)
        if start.trace is not None:
            start.trace.admitted(items, model.name, model.version, who.tier, who.tenant)
        return items

    async def answers(self, model: BatchModel, start: CallStart, items: list[PendingRequest], who: Identity) -> list[Any]:
        """The outputs of the call's inputs, in order. Raises the first error one of them ended with;
        whatever did not finish is withdrawn (never computed if still queued), and a client that left
        is counted before the cancellation goes on."""
        try:
            if len(items) == 1:  # (one input, the usual case: its own future, no gathering)
                return [await items[0].future]
            return list(await asyncio.gather(*(item.future for item in items)))
        except asyncio.CancelledError:
            self.outcomes.record(start.request_id, model.name, who.tier, 499, "CLIENT_DISCONNECTED", start.started,
                                 items[0] if len(items) == 1 else None, who.tenant, start.trace, model.version)
            raise
        finally:
            withdraw_unanswered(model, items)


def call_timing(items: Sequence[PendingRequest], held_s: float) -> str:
    """A multi-input call's `Server-Timing`: how long the server held it, its slowest input's queue and
    compute (an input answered from the cache or another's computation has neither), and how many of
    its inputs the result cache answered."""
    computed = [item for item in items if item.batch is not None]
    timing = f"total;dur={held_s * 1000:.3f}"
    if computed:
        queue = max(item.batch.queue_s(item) for item in computed)  # type: ignore[union-attr]
        compute = max(item.batch.compute_s for item in computed)  # type: ignore[union-attr]
        timing += f", queue;dur={queue * 1000:.3f}, compute;dur={compute * 1000:.3f}"
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
