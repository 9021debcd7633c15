"""The one way a network front runs a call on a batch model, whatever its protocol or wire format
(`/v1/inference`, `/v1/embeddings`, the Open Inference Protocol over HTTP or gRPC): where the call
starts (its clock, its request id), admission's one question, the inputs' futures awaited together,
the inputs withdrawn when the call ends without them (an error, the client gone), and the client that
left counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..admission.admission import Admission
from ..admission.rate_limits import Identity
from ..messages import PendingRequest, RequestState
from ..models.batch_model import BatchModel
from ..observability.outcomes import Call, Outcomes
from .request_ids import RequestIds


def call_start(ids: RequestIds, headers: Mapping[str, str]) -> Call:
    """A call starting now, with the client's `X-Request-ID` (or `Idempotency-Key`) if sane, else a new id."""
    return Call(time.monotonic(), ids.pick(headers.get("X-Request-ID") or headers.get("Idempotency-Key")))


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
    timing = "total;dur=%.3f" % (held_s * 1000)  # noqa: UP031 - the request path's, as `Batch.timing`
    if len(items) == 1:  # (one input, the usual call: its batch's timing, the compute formatted once per batch)
        item = items[0]
        if item.batch is not None:
            return f"{timing}, {item.batch.timing(item)}"
        return timing + ', cache;desc="hit 1 of 1"' if item.state is _CACHED else timing
    computed = [(item, item.batch) for item in items if item.batch is not None]
    if computed:
        last, batch = max(computed, key=lambda pair: pair[1].finished_at)
        timing += ", " + batch.timing(last)
    hits = sum(1 for item in items if item.state is _CACHED)
    if hits:  # (as /v1/inference marks its own: the inputs answered from the result cache)
        timing += f', cache;desc="hit {hits} of {len(items)}"'
    return timing


_CACHED = RequestState.CACHED


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
    if model is None:  # (refused before it was routed: nothing was admitted)
        return
    for item in items:
        if not item.future.done() or item.future.cancelled():
            model.abandon(item)
