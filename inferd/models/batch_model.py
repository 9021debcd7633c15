"""One served batch model: where a request becomes a `PendingRequest` with a future and a deadline, and
where a finished batch resolves those futures on the event loop. It ties one model's stages together:
intake (prepared off the loop when the backend tokenises), the batcher, the deadline wheel, the worker
pool, result delivery. Every path (result, backend error, deadline, client gone, shutdown) resolves a
future at most once, through `done()` guards on the loop; the request's state decides whether it runs.

Faults: a hung or dead worker's batch comes back from the pool and runs again (up to
`max_batch_attempts`); inputs isolated as poison fail alone and go to the dead-letter log; a model that
fails everything trips its circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from functools import partial
from typing import Any

from .. import errors
from ..backends import BatchFunction, build_batch_function
from ..config import ModelConfig, TierConfig
from ..errors import DeadlineExceeded, InferdError, InferenceFailed, InvalidInput, ModelUnavailable, ServiceOverloaded
from ..execution.executor import Worker
from ..execution.faults import BatchLatencies, BreakerState, CircuitBreaker, DeadLetters
from ..execution.pool import WorkerPool
from ..messages import Batch, PendingRequest, RequestState
from ..observability.histogram import Histogram
from ..observability.metrics import RequestMetrics
from ..observability.snapshots import BatchModelSnapshot
from ..scheduling.batcher import Batcher, QueueFull
from ..scheduling.deadlines import DeadlineWheel
from ..scheduling.preprocess import Preprocessor
from . import reports
from .load_model import LoadModel

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
    ) -> None:
        self.config = config
        self.name = config.name
        self.loop = loop
        self.metrics = metrics
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.load = LoadModel(config.max_batch_size)
        self._promote_after_s = {t.name: t.promote_after_ms / 1000.0 for t in tiers if t.promote_after_ms}
        self._tiered = len(tiers) > 1  # (then the tier each batch served is tracked for predicted waits)
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms, max_queue=config.max_queue, loop=loop,
            tiers=[(t.name, t.promote_after_ms / 1000.0 if t.promote_after_ms else None) for t in tiers],
            batch_time_s=lambda: self.load.batch_s, max_batch_tokens=config.max_batch_tokens,
            linger_s=lambda: self.load.linger_s(config.max_wait_ms, config.slo_ms),
        )
        self.pool = WorkerPool(
            name=config.name, devices=config.worker_devices, build=partial(_build_for_device, config),
            warmup_inputs=config.warmup_inputs, next_batch=self.batcher.next_batch, loop=loop,
            latencies=BatchLatencies(config.batch_timeout_ms / 1000.0), on_batch_done=self._on_batch_done,
            on_requeue=self._requeue, on_ready=self._on_worker_ready, max_isolation_calls=config.max_isolation_calls,
        )
        self.deadlines = DeadlineWheel(loop, self._expire)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_ms / 1000.0)
        self.prepare_one: Any = None  # the backend's `prepare(text) -> (input, bucket)`, run on the loop
        self.preprocessor: Preprocessor | None = None  # runs the backend's `prepare_batch` off the loop
        self.output_kind: str | None = None  # the backend's `output_kind` ("embedding": /v1/embeddings)
        self.batches = self.requests_computed = 0
        self.batch_sizes: Counter[int] = Counter()
        self.queue_wait, self.linger, self.compute = Histogram(), Histogram(), Histogram()
        self._batcher_task: asyncio.Task | None = None
        self._stop_reason: InferdError | None = None

    workers = property(lambda self: self.pool.workers, doc="The pool's workers, one per device.")

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._batcher_task = self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}")
        self.pool.start()

    @property
    def ready(self) -> bool:
        """Serving: all workers were warmed once, one is still healthy, and the breaker is not open."""
        return self.pool.warmed and self.pool.healthy > 0 and self.breaker.state is not BreakerState.OPEN

    start_error = property(lambda self: self.pool.start_error, doc="Why the model never came up, if it did not.")

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        self._stop_reason = reason  # what a request still being prepared gets when it comes back
        waiting = self.preprocessor.stop() if self.preprocessor is not None else []
        running = [r for batch in self.pool.running() for r in batch.requests]  # past the grace period
        for request in (*waiting, *self.batcher.stop(), *running):
            self._fail(request, reason)
        if self._batcher_task is not None:
            await asyncio.gather(self._batcher_task, return_exceptions=True)
        await self.pool.stop(join_timeout_s)
        self.deadlines.close()

    # ---- requests --------------------------------------------------------------------------------

    def submit(
        self, request_id: str, raw: Any, timeout_s: float, tier: str = "default", tenant: str = "anonymous"
    ) -> PendingRequest:
        """Take one admitted input: it is prepared (off the loop when the backend has `prepare_batch`),
        then queued. The caller awaits `.future`. Raises InvalidInput or ServiceOverloaded when that is
        known at once; otherwise the future carries it."""
        now = time.monotonic()
        request = PendingRequest(request_id, raw, now, now + timeout_s, self.loop.create_future(), tier=tier,
                                 tenant=tenant, raw=raw)
        if self.preprocessor is not None:
            request.state = RequestState.PREPARING
            self.deadlines.add(request)
            self.preprocessor.put(request)
            return request
        if self.prepare_one is not None:
            try:
                prepared = self.prepare_one(raw)
            except Exception as exc:  # noqa: BLE001 - the input is at fault
                raise self._unreadable(exc) from None
            request.input, request.bucket = prepared[0], prepared[1]
            request.tokens = prepared[2] if len(prepared) > 2 else 0
        self._enqueue(request)
        self.deadlines.add(request)
        return request

    def _enqueue(self, request: PendingRequest) -> None:
        """Into the batcher's queue; raises ServiceOverloaded when it is full and nobody can make room."""
        try:
            shed = self.batcher.submit(request)
        except QueueFull:
            raise self._queue_full(request) from None
        if shed is not None:
            self._shed(shed)

    def _queue_full(self, request: PendingRequest) -> ServiceOverloaded:
        message = f"model {self.name} has {self.config.max_queue} requests waiting"
        return ServiceOverloaded(message, retry_after_ms=self.retry_after_ms(request.tier), reason="queue_full")

    def _shed(self, request: PendingRequest) -> None:
        """A queued request the batcher shed to make room for a higher tier's or a lighter tenant's: 503."""
        message = f"model {self.name} is full: this request made room for a higher tier's or a lighter tenant's"
        self._fail(request, ServiceOverloaded(message, retry_after_ms=self.retry_after_ms(request.tier), reason="queue_full"))

    def _on_prepared(self, requests: list[PendingRequest], results: Any) -> None:
        """Back from the preprocessing thread (on the loop): queue each request that is still waiting."""
        for request, result in zip(requests, results, strict=True):
            if request.state is not RequestState.PREPARING:
                continue  # the client went away or its deadline passed meanwhile
            if self._stop_reason is not None:
                self._fail(request, self._stop_reason)
            elif isinstance(result, BaseException):
                request.state = RequestState.REJECTED
                self._fail(request, self._unreadable(result))
            else:
                request.input, request.bucket = result[0], result[1]
                request.tokens = result[2] if len(result) > 2 else 0
                request.state = RequestState.QUEUED
                try:
                    self._enqueue(request)
                except ServiceOverloaded as error:
                    request.state = RequestState.REJECTED
                    self._fail(request, error)

    def _unreadable(self, exc: BaseException) -> InvalidInput:
        return InvalidInput(f"model {self.name} cannot take this input: {errors.describe(exc)}")

    def abandon(self, request: PendingRequest) -> None:
        """The client went away: a request still waiting is removed and never computed."""
        if request.state is RequestState.PREPARING:
            request.state = RequestState.CANCELLED
        self.batcher.withdraw(request, RequestState.CANCELLED)  # (False unless it was queued)
        self.deadlines.discard(request)
        request.future.cancel()

    def _expire(self, request: PendingRequest) -> None:
        preparing = request.state is RequestState.PREPARING
        if preparing:
            request.state = RequestState.EXPIRED
        left_queue = preparing or self.batcher.withdraw(request, RequestState.EXPIRED)
        if not request.future.done():
            queued = left_queue or request.state is RequestState.EXPIRED
            self.metrics.shed[(self.name, request.tier, "deadline_queued" if queued else "deadline_computing")] += 1
            request.future.set_exception(DeadlineExceeded(f"deadline passed {'while queued' if queued else 'while computing'}"))

    def _fail(self, request: PendingRequest, error: InferdError) -> None:
        self.deadlines.discard(request)
        if not request.future.done():
            request.future.set_exception(error)

    # ---- from the pool (on the loop) -------------------------------------------------------------

    def _on_worker_ready(self, worker: Worker) -> None:
        if not self.load.batch_s:  # the warm-up call is the first measurement
            self.load.observe_batch(worker.warmup_s)
        self.load.note_capacity(self.pool.healthy)
        if self.preprocessor is None and self.prepare_one is None:  # the same for every worker's backend
            backend = worker.backend
            prepare_batch = getattr(backend, "prepare_batch", None)
            if prepare_batch is not None:
                self.preprocessor = Preprocessor(prepare_batch, self.loop, self._on_prepared, self.name)
            else:
                self.prepare_one = getattr(backend, "prepare", None)
            self.output_kind = getattr(backend, "output_kind", None)

    def _on_batch_done(self, batch: Batch) -> None:
        if batch.abandoned:
            return  # the pool gave up on it and its requests went back to the queue: not delivered
        compute = batch.compute_s
        by_rank = Counter(self.batcher.tier_rank(r.tier) for r in batch.requests) if self._tiered else None
        self.load.observe_batch(compute, batch.size, batch.backlog, by_rank, batch.finished_at)
        self.load.note_capacity(self.pool.healthy)
        self.pool.latencies.observe(compute)
        self.batches += 1
        self.requests_computed += batch.size
        self.batch_sizes[batch.size] += 1
        self.compute.observe(compute)
        self.linger.observe(batch.linger_s)
        observe_wait, started, discard = self.queue_wait.observe, batch.started_at, self.deadlines.discard
        for request in batch.requests:
            request.batch = batch
            observe_wait(started - request.enqueued_at)
            discard(request)
        if batch.error is None:
            self.breaker.record(True, batch.finished_at)
            for request, output in zip(batch.requests, batch.outputs, strict=False):  # type: ignore[arg-type]
                if not request.future.done():
                    request.future.set_result(output)
            return
        failures = batch.failures if batch.failures is not None else dict.fromkeys(range(batch.size), batch.error)
        log.warning("model %s batch %d: %d of %d requests failed: %r", self.name, batch.batch_id, len(failures),
                    batch.size, batch.error)
        for i, request in enumerate(batch.requests):
            error = failures.get(i)
            if error is not None and batch.failures is not None:  # isolated: this input fails on its own
                self.dead_letters.add(request, self.name, error)
            if request.future.done():
                continue
            if error is None:
                request.future.set_result(batch.outputs[i])  # type: ignore[index]
            else:
                request.future.set_exception(InferenceFailed(f"inference failed: {errors.describe(error, 480)}"))
        if self.breaker.record(len(failures) < batch.size, batch.finished_at):
            self._open_breaker()

    def _open_breaker(self) -> None:
        """Fail what waits now, quickly, rather than feeding it to a model that fails everything."""
        cooldown_ms = self.config.breaker_cooldown_ms
        log.error("model %s: circuit breaker open for %d ms after repeated failures", self.name, cooldown_ms)
        error = ModelUnavailable(f"model {self.name} is failing; retry later or elsewhere",
                                 retry_after_ms=cooldown_ms, reason="breaker_open")
        for request in self.batcher.withdraw_all():
            self._fail(request, error)

    def _requeue(self, batch: Batch) -> None:
        """A batch the pool gave up on (its worker hung or died): run it again, within the attempts."""
        again = []
        for request in batch.requests:
            if request.future.done():
                continue
            if request.attempts >= self.config.max_batch_attempts:
                self.deadlines.discard(request)
                if time.monotonic() >= request.deadline:
                    request.future.set_exception(DeadlineExceeded("deadline passed while retrying"))
                else:
                    request.future.set_exception(InferenceFailed(f"inference failed: gave up after {request.attempts} attempts"))
                continue
            again.append(request)
        if again:
            self.batcher.requeue_front(again)

    # ---- what it knows about itself --------------------------------------------------------------

    def capacity_scale(self) -> float:
        """Capacity now as a share of the best measured: what rate limits are multiplied by."""
        return self.load.capacity_scale(self.pool.healthy)

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None, tenant: str | None = None) -> float:
        """How long a request of `tier` (default: the lowest) from `tenant` queued now would wait before its
        batch starts, counting the higher tiers' work expected to arrive meanwhile."""
        batcher, load = self.batcher, self.load
        now = time.monotonic() if now is None else now
        ahead = batcher.depth if tier is None else batcher.depth_ahead_of(tier, tenant)
        healthy, first_free_s = self.pool.healthy, self.pool.first_free_s(now, load.batch_s)
        if not self._tiered or tier is None:
            return load.predicted_wait_s(ahead, healthy, first_free_s)
        wait = load.predicted_wait_s(ahead, healthy, first_free_s, load.share_above(batcher.tier_rank(tier), healthy, now))
        promote_s = self._promote_after_s.get(tier)
        return wait if promote_s is None else min(wait, promote_s + 2 * load.batch_s)  # promoted, it goes next

    def retry_after_ms(self, tier: str | None = None) -> int:
        return errors.retry_after_ms(self.predicted_wait_s(tier))

    def snapshot(self, now: float) -> BatchModelSnapshot:
        return reports.snapshot(self, now)

    def describe(self) -> dict[str, Any]:
        return reports.describe(self)


def _build_for_device(config: ModelConfig, device: str) -> BatchFunction:
    return build_batch_function(config.backend, device, config.options, config.factory)
