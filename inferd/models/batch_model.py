"""One served batch model: where a request becomes a `PendingRequest` with a future and a deadline.
It ties one model's stages together: intake (prepared off the loop when the backend tokenises), shared
work (an input in flight or cached is not computed again: `shared_work`), the batcher, the deadline
wheel, the worker pool, result delivery (`Delivery`, which it owns). Every path (result, backend error, deadline,
client gone, shutdown) resolves a future at most once, through `done()` guards on the loop; the
request's state decides whether it runs, and a computation runs while anyone still waits for it.

Faults: a hung or dead worker's batch comes back from the pool and runs again (up to
`max_batch_attempts`); inputs isolated as poison fail alone (with their riders) and go to the
dead-letter log; a model that fails everything trips its circuit breaker.

Why one module: every path that resolves a request's future (and every state change of a request
before it is queued) is here, on the loop, where "at most once" can be read in one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .. import errors
from ..backends import build_batch_function
from ..backends.contract import Capabilities
from ..config import ModelConfig, TierConfig
from ..errors import DeadlineExceeded, InferdError, InvalidInput, ModelUnavailable, NotReady, ServiceOverloaded
from ..execution.breaker import BreakerState, CircuitBreaker
from ..execution.hang_limit import HangLimit
from ..execution.pool import WorkerPool
from ..execution.thread_priority import lower_this_thread
from ..execution.worker import Worker
from ..messages import PendingRequest, RequestState
from ..observability.dead_letters import DeadLetters
from ..observability.metrics import RequestMetrics
from ..observability.snapshots import BatchModelSnapshot
from ..observability.tracing import Tracing
from ..scheduling.batch_costs import BatchCosts
from ..scheduling.batcher import Batcher, QueueFull
from ..scheduling.deadlines import DeadlineWheel
from ..scheduling.preprocess import Preprocessor
from . import reports
from .delivery import Delivery
from .forecast import Forecast
from .shared_work import UNKEYED, SharedWork, waited_for
from .timeliness import Timeliness

log = logging.getLogger("inferd.model")


class BatchModel:
    """A model served through the batcher and executor threads (`kind = "batch"`)."""

    kind = "batch"

    def __init__(
        self,
        config: ModelConfig,
        loop: asyncio.AbstractEventLoop,
        metrics: RequestMetrics,
        dead_letters: DeadLetters | None = None,
        tiers: tuple[TierConfig, ...] = (TierConfig("default"),),
        tracing: Tracing | None = None,
        clock: Callable[[], float] = time.monotonic,
        worker_nice: int = 0,
    ) -> None:
        self.config = config
        self.worker_nice = worker_nice  # its threads' CPU priority below the loop's (`thread_priority`)
        self._clock = clock  # (a fake one in tests that drive the model through time)
        self.name = config.name
        self.version = config.version
        self.takes_traffic = True  # in its model's split (a version loading, draining or only pinned is not)
        self.loop = loop
        self.metrics = metrics
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.costs = BatchCosts(config.max_batch_size, config.slo_ms / 1000.0 if config.slo_ms else None)
        self.forecast = Forecast(self.costs)
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms, max_queue=config.max_queue, loop=loop,
            tiers=[(t.name, t.promote_after_ms / 1000.0 if t.promote_after_ms else None) for t in tiers],
            batch_time_s=lambda: self.forecast.batch_s, costs=self.costs, max_batch_tokens=config.max_batch_tokens,
            linger_s=partial(self.forecast.linger_s, config.max_wait_ms, config.slo_ms), clock=clock,
        )
        self.pool = WorkerPool(
            name=config.name, devices=config.worker_devices, build=partial(build_batch_function, config.backend, options=config.options, factory=config.factory),
            warmup_inputs=config.warmup_inputs, next_batch=self.batcher.next_batch, loop=loop,
            hang_limit=HangLimit(config.batch_timeout_ms / 1000.0),
            on_batch_done=lambda batch: self.delivery.batch_done(batch), on_requeue=lambda batch: self.delivery.requeue(batch),  # (built below)
            on_ready=self._on_worker_ready, max_isolation_calls=config.max_isolation_calls,
            max_batch_size=config.max_batch_size, worker_nice=worker_nice,
        )
        self.timeliness = Timeliness(config, tiers, self.forecast, self.batcher, self.pool)
        self.deadlines = DeadlineWheel(loop, self._expire, clock=clock)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_ms / 1000.0)
        self.tracing = tracing  # (a batch carrying a sampled request is a span of its own)
        self.shared = SharedWork(config)  # identical inputs computed once (collapsing, the result cache)
        self.delivery = Delivery(
            config, shared=self.shared, batcher=self.batcher, deadlines=self.deadlines, forecast=self.forecast,
            timeliness=self.timeliness, hang_limit=self.pool.hang_limit, breaker=self.breaker, dead_letters=self.dead_letters,
            tracing=tracing, healthy_workers=lambda: self.pool.healthy, fail=self.fail,
        )
        self.prepare_one: Any = None  # the backend's `prepare(text) -> (input, bucket)`, run on the loop
        self.offers = Capabilities()  # what the backend offers (`contract`), read once its first worker is ready
        self.preprocessor: Preprocessor | None = None  # runs the backend's `prepare_batch` off the loop
        self.output_kind: str | None = None  # the backend's `output_kind` ("embedding": /v1/embeddings)
        self.input_kind = "text"  # the backend's `input_kind`: text, image or pair
        self.stats = self.delivery.stats  # what its batches have been (delivery writes, reports read)
        self._batcher_task: asyncio.Task | None = None
        self._stop_reason: InferdError | None = None

    workers = property(lambda self: self.pool.workers, doc="The pool's workers, one per device.")

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._batcher_task = self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}")
        self.pool.start()

    @property
    def ready(self) -> bool:
        """Serving: all workers were warmed once, one is still healthy, the breaker is not open, and it is
        not stopping (a version being unloaded admits nothing once its stop began)."""
        return (self.pool.warmed and self.pool.healthy > 0 and self.breaker.state is not BreakerState.OPEN
                and self._stop_reason is None)

    start_error = property(lambda self: self.pool.start_error, doc="Why the model never came up, if it did not.")

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        self._stop_reason = reason  # what a request still being prepared gets when it comes back
        waiting = self.preprocessor.stop() if self.preprocessor is not None else []
        running = [r for batch in self.pool.running() for r in batch.requests]  # past the grace period
        for request in (*waiting, *self.batcher.stop(), *running):
            self.fail(request, reason)
        if self._batcher_task is not None:
            await asyncio.gather(self._batcher_task, return_exceptions=True)
        await self.pool.stop(join_timeout_s)
        self.deadlines.close()

    # ---- requests --------------------------------------------------------------------------------

    def unavailable(self, now: float) -> InferdError | None:
        """Why nothing may be admitted now, if so: its circuit breaker is open, or it is not ready."""
        if self.breaker.state is not BreakerState.CLOSED:
            refusal_s = self.breaker.refusal_s(now)
            if refusal_s is not None:
                return ModelUnavailable(f"model {self.name} is failing; its circuit breaker is open",
                                        retry_after_ms=errors.retry_after_ms(refusal_s), reason="breaker_open")
        if not self.ready:
            return NotReady(f"model {self.name} {'has no healthy worker' if self.pool.warmed else 'is warming up'}",
                            retry_after_ms=1000)
        return None

    def take(self, request_id: str, values: Sequence[Any], timeout_s: float, tier: str, tenant: str,
             use_cache: bool = True) -> list[PendingRequest]:
        """Take the inputs of one call, all or none: one for /v1/inference, several for /v1/embeddings or
        a v2 tensor (each a request of its own, `request_id.i`). An input cached or already in flight is
        answered without entering the queue (an input repeated in the call rides on its first copy), so
        only the others count against the queue's room. Raises what refused it; the caller awaits each
        request's `.future`."""
        if len(values) == 1:  # (its identity found once, for the look-up and, if fresh, its own key)
            raw = values[0]
            key = self.shared.key_of(raw, tenant) if self.shared.enabled else None
            return [self.from_shared_work(request_id, raw, timeout_s, tier, tenant, use_cache, key)
                    or self.submit(request_id, raw, timeout_s, tier, tenant, key=key)]
        if self.offers.check_call is not None:  # (the backend's cheap look at the whole call, e.g. its images' pixels)
            try:
                self.offers.check_call(values)
            except ValueError as exc:
                raise self._unreadable(exc) from None
        ids = [f"{request_id}.{i}" for i in range(len(values))]
        taken = [self.from_shared_work(i, v, timeout_s, tier, tenant, use_cache) for i, v in zip(ids, values, strict=True)]
        try:
            fresh = [i for i, request in enumerate(taken) if request is None]
            if fresh and self.batcher.depth + len(fresh) > self.config.max_queue:
                raise ServiceOverloaded(f"model {self.name} cannot queue {len(fresh)} more inputs",
                                        retry_after_ms=self.retry_after_ms(tier), reason="queue_full")
            for i in fresh:  # (the cache was asked above: now only an earlier input of this call can lead)
                taken[i] = (self.from_shared_work(ids[i], values[i], timeout_s, tier, tenant, use_cache=False)
                            or self.submit(ids[i], values[i], timeout_s, tier, tenant, call=request_id))
        except BaseException:
            for request in taken:  # all or none: what was taken is withdrawn
                if request is not None:
                    self.abandon(request)
            raise
        return taken  # type: ignore[return-value]

    def from_shared_work(
        self, request_id: str, raw: Any, timeout_s: float, tier: str, tenant: str, use_cache: bool = True,
        key: Any = UNKEYED,
    ) -> PendingRequest | None:
        """An input computed already (answered from the cache) or being computed now (attached to that
        computation): a request that never enters the queue. None: it must be submitted. `key`: the
        input's identity (`SharedWork.key_of`), when the caller has it."""
        now = self._clock()
        found = self.shared.find(raw, tenant, use_cache, now, key)
        if found is None:
            return None
        key, cached, lead = found
        request = self._new_request(request_id, raw, now, timeout_s, tier, tenant)
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
        self, request_id: str, raw: Any, timeout_s: float, tier: str = "default", tenant: str = "anonymous",
        call: str | None = None, key: Any = UNKEYED,
    ) -> PendingRequest:
        """Take one admitted input: it is prepared (off the loop when the backend has `prepare_batch`),
        then queued, unless it would not finish in time (`timeliness`). The caller awaits `.future`.
        `call`: the id of the multi-input call it is one input of (its inputs take turns with the
        tenant's other calls in the queue); `key`: its identity, when the caller has it.
        Raises InvalidInput or ServiceOverloaded when that is known at once; otherwise the future
        carries it."""
        now = self._clock()
        request = self._new_request(request_id, raw, now, timeout_s, tier, tenant)
        request.call = call
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
                raise self._unreadable(exc) from None
            request.input, request.bucket = prepared[0], prepared[1]
            request.tokens = prepared[2] if len(prepared) > 2 else 0
        self._enqueue(request, now)
        self.deadlines.add(request)
        self.shared.register_lead(request)
        return request

    def _new_request(self, request_id: str, raw: Any, now: float, timeout_s: float, tier: str, tenant: str) -> PendingRequest:
        """A request admitted now, with its deadline and, where its model or tier sets one, its objective."""
        deadline = now + timeout_s
        slo_s = self.timeliness.slo_s(tier)
        slo_at = None if slo_s is None else now + slo_s
        due = deadline if slo_at is None or slo_at > deadline else slo_at
        return PendingRequest(request_id, raw, now, deadline, self.loop.create_future(), due=due, slo_at=slo_at,
                              tier=tier, tenant=tenant, raw=raw)

    def _enqueue(self, request: PendingRequest, now: float) -> None:
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
            self._shed(shed, request)

    def _shed(self, request: PendingRequest, newcomer: PendingRequest) -> None:
        """A queued request the batcher shed to make room for a higher tier's or a lighter tenant's: 503."""
        whom = "higher_tier" if newcomer.tier != request.tier else "lighter_tenant"
        message = f"model {self.name} is full: this request made room for a {whom.replace('_', ' ')}'s"
        self.fail(request, ServiceOverloaded(message, retry_after_ms=self.retry_after_ms(request.tier), reason=f"shed_for_{whom}"))

    def _on_prepared(self, requests: list[PendingRequest], results: Any) -> None:
        """Back from the preprocessing thread (on the loop): queue each request that is still waiting."""
        for request, result in zip(requests, results, strict=True):
            if request.state is not RequestState.PREPARING:
                continue  # the client went away or its deadline passed meanwhile
            if self._stop_reason is not None:
                self.fail(request, self._stop_reason)
            elif isinstance(result, BaseException):
                request.state = RequestState.REJECTED
                self.fail(request, self._unreadable(result))
            else:
                request.input, request.bucket = result[0], result[1]
                request.tokens = result[2] if len(result) > 2 else 0
                request.state = RequestState.QUEUED
                try:
                    self._enqueue(request, self._clock())
                except ServiceOverloaded as error:
                    request.state = RequestState.REJECTED
                    self.fail(request, error)

    def _unreadable(self, exc: BaseException) -> InferdError:
        if isinstance(exc, InferdError):  # (a backend's own answer, e.g. 413 for an image over its limits)
            return exc
        return InvalidInput(f"model {self.name} cannot take this input: {errors.describe(exc)}")

    def abandon(self, request: PendingRequest) -> None:
        """The client went away: a request still waiting is removed and never computed, unless another
        client waits on the same computation (collapsing)."""
        self.deadlines.discard(request)
        request.future.cancel()
        if request.state is RequestState.ATTACHED:
            self._withdraw_if_unwanted(request.lead)  # type: ignore[arg-type]
        elif request.state is not RequestState.CACHED:
            self._withdraw_if_unwanted(request, RequestState.CANCELLED)

    def _withdraw_if_unwanted(self, lead: PendingRequest, state: RequestState = RequestState.CANCELLED) -> None:
        """Take a computation nobody waits for out of the queue (one already running goes on)."""
        if waited_for(lead):
            return
        if lead.state is RequestState.PREPARING:
            lead.state = state
        else:
            self.batcher.withdraw(lead, state)  # (does nothing unless it is queued)
        if lead.key is not None and lead.state is not RequestState.TAKEN:
            self.shared.settle(lead)

    def _expire(self, request: PendingRequest) -> None:
        lead: PendingRequest = request.lead if request.state is RequestState.ATTACHED else request  # type: ignore[assignment]
        if not request.future.done():
            where = "computing" if lead.state is RequestState.TAKEN else "queued"
            self.metrics.expired[(self.name, request.tier, where)] += 1
            request.future.set_exception(DeadlineExceeded(f"deadline passed while {where}"))
        self._withdraw_if_unwanted(lead, RequestState.EXPIRED)  # (unless a rider still waits for it)

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

    # ---- from the pool (on the loop) -------------------------------------------------------------

    def _on_worker_ready(self, worker: Worker) -> None:
        if not self.forecast.batch_s:  # the warm-up call is the first measurement
            self.forecast.observe_batch(worker.warmup_s)
        self.costs.measured(worker.measured_costs)
        self.forecast.note_capacity(self.pool.healthy)
        if self.preprocessor is None and self.prepare_one is None:  # the same for every worker's backend
            offers = worker.capabilities
            if offers.prepare_batch is not None:
                self.preprocessor = Preprocessor(offers.prepare_batch, self.loop, self._on_prepared, self.name,
                                                 partial(lower_this_thread, max(self.worker_nice, offers.prepare_nice)),
                                                 offers.prepare_threads, offers.prepare_max_batch,
                                                 together_limit=self.config.max_batch_size // 4 if offers.buckets_by_length else 0)
            else:
                self.prepare_one = offers.prepare
            self.output_kind, self.input_kind, self.offers = offers.output_kind, offers.input_kind, offers

    # ---- what it knows about itself --------------------------------------------------------------

    def capacity_scale(self) -> float:
        """Capacity now as a share of the best measured: what rate limits are multiplied by."""
        return self.forecast.capacity_scale(self.pool.healthy)

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None, tenant: str | None = None) -> float:
        """How long a request of `tier` (default: behind everything) from `tenant` queued now would wait
        before its batch starts, counting the higher tiers' work expected to arrive meanwhile."""
        return self.timeliness.wait_and_ahead(tier, self._clock() if now is None else now, tenant)[0]

    def retry_after_ms(self, tier: str | None = None) -> int:
        return errors.retry_after_ms(self.predicted_wait_s(tier))

    def snapshot(self, now: float) -> BatchModelSnapshot:
        return reports.snapshot(self, now)

    def describe(self) -> dict[str, Any]:
        return reports.describe(self)

