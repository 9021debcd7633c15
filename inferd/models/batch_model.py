"""One served batch model: where a request becomes a `PendingRequest` with a future and a deadline, and
where a finished batch resolves those futures on the event loop.

It ties the stages of one model together: intake (prepared off the loop by the preprocessing stage when
the backend tokenises), the batcher, the deadline wheel, the worker pool, and result delivery. Every
path (result, backend error, deadline, client gone, shutdown) resolves a future at most once: all of
them go through `done()` guards on the loop, and the request's state decides whether it may still run.

Faults: a hung or dead worker's batch comes back from the pool and runs again (up to
`max_batch_attempts`); requests isolated as poison by the worker's bisection fail alone and go to the
dead-letter log; a model that fails everything trips its circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from functools import partial
from typing import Any

from ..backends import BatchFunction, build_batch_function
from ..config import ModelConfig, TierConfig
from ..errors import (
    DeadlineExceeded,
    InferdError,
    InferenceFailed,
    InvalidInput,
    ModelUnavailable,
    ServiceOverloaded,
    describe,
    retry_after_ms,
)
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
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms, max_queue=config.max_queue, loop=loop,
            tiers=[(t.name, t.promote_after_ms / 1000.0 if t.promote_after_ms else None) for t in tiers],
            batch_time_s=lambda: self.load.batch_s,
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

    @property
    def workers(self) -> list[Worker]:
        return self.pool.workers

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._batcher_task = self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}")
        self.pool.start()

    @property
    def ready(self) -> bool:
        """Serving: all workers were warmed once, one is still healthy, and the breaker is not open."""
        return self.pool.warmed and self.pool.healthy > 0 and self.breaker.state is not BreakerState.OPEN

    @property
    def start_error(self) -> BaseException | None:
        return self.pool.start_error

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        self._stop_reason = reason  # what a request still being prepared gets when it comes back
        if self.preprocessor is not None:
            for request in self.preprocessor.stop():
                self._fail(request, reason)
        for request in self.batcher.stop():
            self._fail(request, reason)
        for batch in self.pool.running():  # batches still running when the grace period ended
            for request in batch.requests:
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
        request = PendingRequest(request_id, raw, now, now + timeout_s, self.loop.create_future(), tier=tier, tenant=tenant)
        if self.preprocessor is not None:
            request.raw = raw
            request.state = RequestState.PREPARING
            self.deadlines.add(request)
            self.preprocessor.put(request)
            return request
        if self.prepare_one is not None:
            try:
                request.input, request.bucket = self.prepare_one(raw)
            except Exception as exc:  # noqa: BLE001 - the input is at fault
                raise self._unreadable(exc) from None
            request.raw = raw
        try:
            self.batcher.submit(request)
        except QueueFull:
            raise self._queue_full(tier) from None
        self.deadlines.add(request)
        return request

    def _queue_full(self, tier: str) -> ServiceOverloaded:
        return ServiceOverloaded(f"model {self.name} has {self.config.max_queue} requests waiting",
                                 retry_after_ms=self.retry_after_ms(tier), reason="queue_full")

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
                    self.batcher.submit(request)
                except QueueFull:
                    request.state = RequestState.REJECTED
                    self.metrics.shed[(self.name, request.tier, "queue_full")] += 1
                    self._fail(request, self._queue_full(request.tier))

    def _unreadable(self, exc: BaseException) -> InvalidInput:
        return InvalidInput(f"model {self.name} cannot take this input: {describe(exc)}")

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
        self.load.observe_batch(compute)
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
                request.future.set_exception(InferenceFailed(f"inference failed: {describe(error, 480)}"))
        if self.breaker.record(len(failures) < batch.size, batch.finished_at):
            self._open_breaker()

    def _open_breaker(self) -> None:
        """Fail what waits now, quickly, rather than feeding it to a model that fails everything."""
        cooldown_ms = self.config.breaker_cooldown_ms
        log.error("model %s: circuit breaker open for %d ms after repeated failures", self.name, cooldown_ms)
        error = ModelUnavailable(f"model {self.name} is failing; retry later or elsewhere", retry_after_ms=cooldown_ms)
        for request in self.batcher.withdraw_all():
            self.metrics.shed[(self.name, request.tier, "breaker_open")] += 1
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

    def unavailable_for_s(self, now: float) -> float | None:
        """While the breaker is open: seconds until it lets a probe through."""
        return self.breaker.refusal_s(now)

    def capacity_scale(self) -> float:
        """Capacity now as a share of the best measured: what rate limits are multiplied by."""
        return self.load.capacity_scale(self.pool.healthy)

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None) -> float:
        """How long a request of `tier` (default: the lowest) queued now would wait before its batch starts."""
        batcher, load = self.batcher, self.load
        ahead = batcher.depth if tier is None else batcher.depth_ahead_of(tier)
        return load.predicted_wait_s(ahead, self.pool.healthy, self.pool.first_free_s(
            time.monotonic() if now is None else now, load.batch_s))

    def retry_after_ms(self, tier: str | None = None) -> int:
        return retry_after_ms(self.predicted_wait_s(tier))

    def snapshot(self, now: float) -> BatchModelSnapshot:
        return reports.snapshot(self, now)

    def describe(self) -> dict[str, Any]:
        return reports.describe(self)


def _build_for_device(config: ModelConfig, device: str) -> BatchFunction:
    return build_batch_function(config.backend, device, config.options, config.factory)
