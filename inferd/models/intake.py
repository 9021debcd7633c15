"""A batch model's requests from admission to departure: where an input becomes a `PendingRequest`
with a future, a deadline and, where one is set, an objective; then shared work (an input in flight
or cached is not computed again: `shared_work`), preparing off the loop (when the backend tokenises),
the batcher's queue, the deadline wheel; and every way a request leaves before or without a batch of
its own: refused, expired, withdrawn (its client went away), failed, or answered from the cache. What
leaves with a batch is `delivery`'s. Each path resolves a future at most once, through `done()`
guards on the loop; the request's state decides whether it runs, and a computation runs while
anyone still waits for it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from .. import errors
from ..config import ModelConfig
from ..errors import DeadlineExceeded, InferdError, InvalidInput, ServiceOverloaded
from ..messages import Client, PendingRequest, RequestState
from ..scheduling.batcher import Batcher, QueueFull
from ..scheduling.deadlines import DeadlineWheel
from ..scheduling.preprocess import Preprocessor
from .shared_work import UNKEYED, SharedWork, waited_for
from .timeliness import Timeliness


class Intake:
    """One batch model's requests on the loop (see the module docstring). The model's wiring
    (`batch_model`) builds it and sets what the backend offers once a worker is ready."""

    def __init__(self, config: ModelConfig, loop: asyncio.AbstractEventLoop, *, batcher: Batcher, timeliness: Timeliness,
                 shared: SharedWork, expired: defaultdict[tuple[str, str, str], int], clock: Callable[[], float]) -> None:
        self.config = config
        self.name = config.name
        self.loop = loop
        self.batcher = batcher
        self.timeliness = timeliness
        self.shared = shared
        self.expired = expired  # (the metrics' count of requests whose deadline passed, by model, tier, where)
        self.clock = clock
        self.deadlines = DeadlineWheel(loop, self.expire, clock=clock)
        self.prepare_one: Any = None  # the backend's `prepare(text) -> (input, bucket)`, run on the loop
        self.preprocessor: Preprocessor | None = None  # runs the backend's `prepare_batch` off the loop
        self.check_call: Callable[[Sequence[Any]], None] | None = None  # the backend's look at a whole call
        self.stop_reason: InferdError | None = None  # once the model is stopping: what a request coming back gets

    def retry_after_ms(self, tier: str | None = None) -> int:
        """A refusal's `retry_after_ms`: how long a request of `tier` queued now would wait."""
        return errors.retry_after_ms(self.timeliness.wait_and_ahead(tier, self.clock(), None)[0])

    def take(self, request_id: str, values: Sequence[object], timeout_s: float, tier: str, tenant: str,
             use_cache: bool = True, client: Client | None = None) -> list[PendingRequest]:
        """Take the inputs of one call, all or none: one for /v1/inference, several for /v1/embeddings or
        a v2 tensor (each a request of its own, `request_id.i`). An input cached or already in flight is
        answered without entering the queue (an input repeated in the call rides on its first copy), so
        only the others count against the queue's room. Raises what refused it; the caller awaits each
        request's `.future`. `client`: the connection it came on, where known (the batcher's echo)."""
        if len(values) == 1:  # (its identity found once, for the look-up and, if fresh, its own key)
            raw = values[0]
            key = self.shared.key_of(raw, tenant) if self.shared.enabled else None
            return [self.from_shared_work(request_id, raw, timeout_s, tier, tenant, use_cache, key)
                    or self.submit(request_id, raw, timeout_s, tier, tenant, key=key, client=client)]
        if self.check_call is not None:  # (the backend's cheap look at the whole call, e.g. its images' pixels)
            try:
                self.check_call(values)
            except ValueError as exc:
                raise self.unreadable(exc) from None
        ids = [f"{request_id}.{i}" for i in range(len(values))]
        taken = [self.from_shared_work(i, v, timeout_s, tier, tenant, use_cache) for i, v in zip(ids, values, strict=True)]
        try:
            fresh = [i for i, request in enumerate(taken) if request is None]
            if fresh and self.batcher.depth + len(fresh) > self.config.max_queue:
                raise ServiceOverloaded(f"model {self.name} cannot queue {len(fresh)} more inputs",
                                        retry_after_ms=self.retry_after_ms(tier), reason="queue_full")
            for i in fresh:  # (the cache was asked above: now only an earlier input of this call can lead)
                taken[i] = (self.from_shared_work(ids[i], values[i], timeout_s, tier, tenant, use_cache=False)
                            or self.submit(ids[i], values[i], timeout_s, tier, tenant, of_call=(request_id, len(values)),
                                           client=client))
        except BaseException:
            for request in taken:  # all or none: what was taken is withdrawn
                if request is not None:
                    self.abandon(request)
            raise
        return taken  # type: ignore[return-value]

    def from_shared_work(
        self, request_id: str, raw: object, timeout_s: float, tier: str, tenant: str, use_cache: bool = True,
        key: object = UNKEYED,
    ) -> PendingRequest | None:
        """An input computed already (answered from the cache) or being computed now (attached to that
        computation): a request that never enters the queue. None: it must be submitted. `key`: the
        input's identity (`SharedWork.key_of`), when the caller has it."""
        now = self.clock()
        found = self.shared.find(raw, tenant, use_cache, now, key)
        if found is None:
            return None
        key, cached, lead = found
        request = self.new_request(request_id, raw, now, timeout_s, tier, tenant)
        request.key = key
        if lead is None:
            request.state = RequestState.CACHED
            output, request.bucket, request.tokens = cached
            request.future.set_result(output)
            return request
        request.state, request.lead = RequestState.ATTACHED, lead
        self.shared.attach(lead, request)
        self.deadlines.add(request)
        if lead.state is RequestState.PREPARING and self.batcher.tier_rank(tier) > self.batcher.tier_rank(lead.tier):
            lead.tier = tier  # the computation runs at its best waiter's priority (and is shed as such)
        elif lead.state is RequestState.QUEUED:
            self.batcher.promote(lead, tier)
        return request

    def submit(
        self, request_id: str, raw: object, timeout_s: float, tier: str = "default", tenant: str = "anonymous",
        *, of_call: tuple[str, int] | None = None, key: object = UNKEYED, client: Client | None = None,
    ) -> PendingRequest:
        """Take one admitted input: it is prepared (off the loop when the backend has `prepare_batch`),
        then queued, unless it would not finish in time (`timeliness`). The caller awaits `.future`.
        `of_call`: the multi-input call it is one input of, its id and its inputs' count (its inputs take
        turns with the tenant's other calls in the queue); `key`: its identity, when the caller
        has it.
        Raises InvalidInput or ServiceOverloaded when that is known at once; otherwise the future
        carries it."""
        now = self.clock()
        request = self.new_request(request_id, raw, now, timeout_s, tier, tenant)
        request.client = client
        if of_call is not None:
            request.call_id, request.call_size = of_call
        if self.shared.enabled:
            request.key = self.shared.key_of(raw, tenant) if key is UNKEYED else key
        if self.preprocessor is not None:
            if not self.timeliness.surely_in_time(request, now):  # (before the work of preparing it)
                refusal = self.timeliness.refusal(request, now, bucket=None)
                if refusal is not None:
                    raise refusal
            request.state = RequestState.PREPARING
            self.deadlines.add(request)
            self.preprocessor.put(request)
            self.shared.register_lead(request)
            return request
        if self.prepare_one is not None:
            try:
                prepared = self.prepare_one(raw)
            except Exception as exc:  # noqa: BLE001 - the input is at fault
                raise self.unreadable(exc) from None
            request.input, request.bucket = prepared[0], prepared[1]
            request.tokens = prepared[2] if len(prepared) > 2 else 0
        self.enqueue(request, now)
        self.deadlines.add(request)
        self.shared.register_lead(request)
        return request

    def new_request(self, request_id: str, raw: object, now: float, timeout_s: float, tier: str, tenant: str) -> PendingRequest:
        """A request admitted now, with its deadline and, where its model or tier sets one, its objective."""
        deadline = now + timeout_s
        slo_s = self.timeliness.slo_s(tier)
        slo_at = None if slo_s is None else now + slo_s
        due = deadline if slo_at is None or slo_at > deadline else slo_at
        return PendingRequest(request_id, raw, now, deadline, self.loop.create_future(), due=due, slo_at=slo_at,
                              tier=tier, tenant=tenant, raw=raw)

    def enqueue(self, request: PendingRequest, now: float) -> None:
        """Into the batcher's queue; raises ServiceOverloaded when it would not finish in time, or the
        queue is full and nobody can make room."""
        timeliness = self.timeliness
        if timeliness.asks(request, now):  # (where the cheap bound cannot answer, and a sample of the rest)
            refusal = timeliness.refusal(request, now, request.bucket)
            if refusal is not None:
                raise refusal
        try:
            shed = self.batcher.submit(request)
        except QueueFull:
            raise ServiceOverloaded(f"model {self.name} has {self.config.max_queue} requests waiting",
                                    retry_after_ms=self.retry_after_ms(request.tier), reason="queue_full") from None
        if shed is not None:
            self.shed(shed, request)

    def shed(self, request: PendingRequest, newcomer: PendingRequest) -> None:
        """A queued request the batcher shed to make room for a higher tier's or a lighter tenant's: 503."""
        whom = "higher_tier" if newcomer.tier != request.tier else "lighter_tenant"
        message = f"model {self.name} is full: this request made room for a {whom.replace('_', ' ')}'s"
        self.fail(request, ServiceOverloaded(message, retry_after_ms=self.retry_after_ms(request.tier), reason=f"shed_for_{whom}"))

    def on_prepared(self, requests: list[PendingRequest], results: Sequence[Any]) -> None:
        """Back from the preprocessing thread (on the loop): queue each request that is still waiting."""
        for request, result in zip(requests, results, strict=True):
            if request.state is not RequestState.PREPARING:
                continue  # the client went away or its deadline passed meanwhile
            if self.stop_reason is not None:
                self.fail(request, self.stop_reason)
            elif isinstance(result, BaseException):
                request.state = RequestState.REJECTED
                self.fail(request, self.unreadable(result))
            else:
                request.input, request.bucket = result[0], result[1]
                request.tokens = result[2] if len(result) > 2 else 0
                request.state = RequestState.QUEUED
                try:
                    self.enqueue(request, self.clock())
                except ServiceOverloaded as error:
                    request.state = RequestState.REJECTED
                    self.fail(request, error)

    def unreadable(self, exc: BaseException) -> InferdError:
        if isinstance(exc, InferdError):  # (a backend's own answer, e.g. 413 for an image over its limits)
            return exc
        return InvalidInput(f"model {self.name} cannot take this input: {errors.describe(exc)}")

    def abandon(self, request: PendingRequest) -> None:
        """The client went away: a request still waiting is removed and never computed, unless another
        client waits on the same computation (collapsing)."""
        self.deadlines.discard(request)
        request.future.cancel()
        lead = request.lead
        if request.state is RequestState.ATTACHED and lead is not None:  # (an attached request has its lead)
            self.withdraw_if_unwanted(lead)
        elif request.state is not RequestState.CACHED:
            self.withdraw_if_unwanted(request, RequestState.CANCELLED)

    def withdraw_if_unwanted(self, lead: PendingRequest, state: RequestState = RequestState.CANCELLED) -> None:
        """Take a computation nobody waits for out of the queue (one already running goes on)."""
        if waited_for(lead):
            return
        if lead.state is RequestState.PREPARING:
            lead.state = state
        else:
            self.batcher.withdraw(lead, state)  # (does nothing unless it is queued)
        if lead.state is not RequestState.TAKEN:  # (a computation running is delivered, riders and all)
            lead.riders = None  # (nobody waits: a rider points at its lead, they must not hold each other)
            if lead.key is not None:
                self.shared.settle(lead)

    def expire(self, request: PendingRequest) -> None:
        lead = request.lead if request.state is RequestState.ATTACHED and request.lead is not None else request
        if not request.future.done():
            where = "computing" if lead.state is RequestState.TAKEN else "queued"
            self.expired[(self.name, request.tier, where)] += 1
            request.future.set_exception(DeadlineExceeded(f"deadline passed while {where}"))
        self.withdraw_if_unwanted(lead, RequestState.EXPIRED)  # (unless a rider still waits for it)

    def fail(self, request: PendingRequest, error: InferdError) -> None:
        """A computation that will not run (or failed): its request and every rider get `error`."""
        self.deadlines.discard(request)
        if not request.future.done():
            request.future.set_exception(error)
        for rider in request.riders or ():
            self.deadlines.discard(rider)
            if not rider.future.done():
                rider.future.set_exception(error)
        request.riders = None  # (answered: a rider points at its lead, they must not hold each other)
        if request.key is not None:
            self.shared.settle(request)
