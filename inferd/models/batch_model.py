"""One served batch model, wired: its stages built and tied together, started and stopped. A request's
way from admission to its departure is `intake` (its future, deadline, shared work, preparing and
queueing, and every way it leaves without a batch); the batcher forms batches; the worker pool runs
them; `delivery` hands each batch's outputs back (the other way a future is resolved).

Faults: a hung or dead worker's batch comes back from the pool and runs again (up to
`max_batch_attempts`), unless its worker died soon after its slot's last death (then it fails at once,
with what waits when no worker is left: `WorkerPool`); inputs isolated as poison fail alone (with their riders) and go to the
dead-letter log; a model that fails everything trips its circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .. import errors
from ..backends import build_batch_function
from ..backends.contract import Capabilities
from ..config import ModelConfig, TierConfig
from ..errors import InferdError, ModelUnavailable, NotReady
from ..execution.breaker import BreakerState, CircuitBreaker
from ..execution.hang_limit import HangLimit
from ..execution.pool import WorkerPool
from ..execution.thread_priority import lower_this_thread
from ..execution.worker import Worker
from ..observability.dead_letters import DeadLetters
from ..observability.metrics import RequestMetrics
from ..observability.snapshots import BatchModelSnapshot
from ..observability.tracing import Tracing
from ..scheduling.batch_costs import BatchCosts
from ..scheduling.batcher import Batcher
from ..scheduling.preprocess import Preprocessor
from . import reports
from .delivery import Delivery
from .forecast import Forecast
from .intake import Intake
from .shared_work import SharedWork
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
            name=config.name, devices=config.worker_devices,
            build=partial(build_batch_function, config.backend, options=config.options, factory=config.factory),
            warmup_inputs=config.warmup_inputs, next_batch=self.batcher.next_batch, loop=loop,
            hang_limit=HangLimit(config.batch_timeout_ms / 1000.0),
            on_batch_done=lambda batch: self.delivery.batch_done(batch),  # (delivery is built below)
            on_requeue=lambda batch: self.delivery.requeue(batch),
            on_lost=lambda batches, retry_after_s: self.delivery.lost(batches, retry_after_s),
            on_ready=self._on_worker_ready, max_isolation_calls=config.max_isolation_calls,
            max_batch_size=config.max_batch_size, worker_nice=worker_nice,
        )
        self.timeliness = Timeliness(config, tiers, self.forecast, self.batcher, self.pool)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_ms / 1000.0)
        self.tracing = tracing  # (a batch carrying a sampled request is a span of its own)
        self.shared = SharedWork(config)  # identical inputs computed once (collapsing, the result cache)
        self.intake = intake = Intake(config, loop, batcher=self.batcher, timeliness=self.timeliness, shared=self.shared,
                                      expired=metrics.expired, clock=clock)
        self.deadlines = intake.deadlines
        self.delivery = Delivery(
            config, shared=self.shared, batcher=self.batcher, deadlines=self.deadlines, forecast=self.forecast,
            timeliness=self.timeliness, hang_limit=self.pool.hang_limit, breaker=self.breaker, dead_letters=self.dead_letters,
            tracing=tracing, healthy_workers=lambda: self.pool.healthy, fail=intake.fail,
        )
        # A request's way in and out, as the intake runs it (bound once: admission calls `take` per call).
        self.take, self.submit, self.from_shared_work = intake.take, intake.submit, intake.from_shared_work
        self.abandon, self.fail, self.retry_after_ms = intake.abandon, intake.fail, intake.retry_after_ms
        self.offers = Capabilities()  # what the backend offers (`contract`), read once its first worker is ready
        self.output_kind: str | None = None  # the backend's `output_kind` ("embedding": /v1/embeddings)
        self.input_kind = "text"  # the backend's `input_kind`: text, image or pair
        self.stats = self.delivery.stats  # what its batches have been (delivery writes, reports read)
        self._batcher_task: asyncio.Task | None = None

    workers = property(lambda self: self.pool.workers, doc="The pool's workers, one per device.")
    preprocessor = property(lambda self: self.intake.preprocessor, doc="Runs the backend's `prepare_batch` off the loop.")
    prepare_one = property(lambda self: self.intake.prepare_one, doc="The backend's `prepare`, run on the loop.")

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._batcher_task = self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}")
        self.pool.start()

    @property
    def ready(self) -> bool:
        """Serving: all workers were warmed once, one is still healthy, the breaker is not open, and it is
        not stopping (a version being unloaded admits nothing once its stop began)."""
        return (self.pool.warmed and self.pool.healthy > 0 and self.breaker.state is not BreakerState.OPEN
                and self.intake.stop_reason is None)

    start_error = property(lambda self: self.pool.start_error, doc="Why the model never came up, if it did not.")

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        self.intake.stop_reason = reason  # what a request still being prepared gets when it comes back
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

    # ---- from the pool (on the loop) -------------------------------------------------------------

    def _on_worker_ready(self, worker: Worker) -> None:
        if not self.forecast.batch_s:  # the warm-up call is the first measurement
            self.forecast.observe_batch(worker.warmup_s)
        self.costs.measured(worker.measured_costs)
        self.forecast.note_capacity(self.pool.healthy)
        intake = self.intake
        if intake.preprocessor is None and intake.prepare_one is None:  # the same for every worker's backend
            offers = worker.capabilities
            if offers.prepare_batch is not None:
                intake.preprocessor = Preprocessor(offers.prepare_batch, self.loop, intake.on_prepared, self.name,
                                                   partial(lower_this_thread, max(self.worker_nice, offers.prepare_nice)),
                                                   offers.prepare_threads, offers.prepare_max_batch,
                                                   together_limit=self.config.max_batch_size // 4 if offers.buckets_by_length else 0,
                                                   short_call=self.config.max_batch_size // 4,
                                                   large_micro_batch=self.config.max_batch_size)
            else:
                intake.prepare_one = offers.prepare
            intake.check_call = offers.check_call
            self.output_kind, self.input_kind, self.offers = offers.output_kind, offers.input_kind, offers

    # ---- what it knows about itself --------------------------------------------------------------

    def capacity_scale(self) -> float:
        """Capacity now as a share of the best measured: what rate limits are multiplied by."""
        return self.forecast.capacity_scale(self.pool.healthy)

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None, tenant: str | None = None) -> float:
        """How long a request of `tier` (default: behind everything) from `tenant` queued now would wait
        before its batch starts, counting the higher tiers' work expected to arrive meanwhile."""
        return self.timeliness.wait_and_ahead(tier, self._clock() if now is None else now, tenant)[0]

    def snapshot(self, now: float) -> BatchModelSnapshot:
        return reports.snapshot(self, now)

    def describe(self) -> dict[str, Any]:
        return reports.describe(self)

