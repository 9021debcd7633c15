"""Where a finished batch becomes answers: each request's future (and its riders') resolved on the
event loop, what the batch taught the load model and the breaker, and what happens to a batch the pool
gave up on. Every path resolves a future at most once (`done()` guards).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from .. import errors
from ..config import ModelConfig
from ..errors import DeadlineExceeded, InferdError, InferenceFailed, ModelUnavailable
from ..execution.breaker import CircuitBreaker
from ..execution.pool import WorkerPool
from ..messages import Batch, PendingRequest
from ..observability.batch_stats import BatchStats
from ..observability.dead_letters import DeadLetters
from ..observability.tracing import Tracing
from ..scheduling.batcher import Batcher
from ..scheduling.deadlines import DeadlineWheel
from .forecast import Forecast
from .shared_work import SharedWork, waited_for
from .timeliness import Timeliness

log = logging.getLogger("inferd.model")


class BatchModel(Protocol):
    """What delivery reads and calls of the batch model it answers for (`batch_model.BatchModel`)."""

    name: str
    config: ModelConfig
    shared: SharedWork
    tracing: Tracing | None
    stats: BatchStats
    pool: WorkerPool
    forecast: Forecast
    deadlines: DeadlineWheel
    breaker: CircuitBreaker
    batcher: Batcher
    timeliness: Timeliness
    dead_letters: DeadLetters

    def fail(self, request: PendingRequest, error: InferdError) -> None: ...


def batch_done(model: BatchModel, batch: Batch) -> None:
    """Answer a batch's requests (and their riders), and learn from how it went."""
    if batch.abandoned:
        return  # the pool gave up on it and its requests went back to the queue: not delivered
    _answer(model, batch)
    batch.delivered()


def _answer(model: BatchModel, batch: Batch) -> None:
    compute = batch.compute_s
    # (a failed batch's time holds its bisection's extra calls: it says nothing of what a batch costs)
    model.forecast.observe_batch(compute, batch.size if batch.error is None else 0, batch.bucket,
                                 batch.backlog, batch.gap_s)
    model.forecast.note_capacity(model.pool.healthy)
    model.pool.latencies.observe(compute)
    model.stats.record(batch)
    observe_wait, started, discard = model.stats.queue_wait.observe, batch.started_at, model.deadlines.discard
    for request in batch.requests:
        request.batch = batch
        waited = started - request.enqueued_at
        observe_wait(waited)
        discard(request)
        if request.predicted_wait is not None:
            model.timeliness.observe_wait_error(request.tier, waited - request.predicted_wait)
    if model.tracing is not None:
        model.tracing.batch(batch, model.name)
    if batch.error is None:
        model.breaker.record(True, batch.finished_at)
        leads, cache = model.shared.leads, model.shared.cache
        for request, output in zip(batch.requests, batch.outputs, strict=False):  # type: ignore[arg-type]
            if not request.future.done():
                request.future.set_result(output)
            key = request.key
            if key is not None:
                if request.riders or cache is not None:
                    _deliver_shared(model, request, batch, output)
                elif leads.get(key) is request:  # (as `SharedWork.settle`, inline: per request)
                    del leads[key]
        return
    failures = batch.failures if batch.failures is not None else dict.fromkeys(range(batch.size), batch.error)
    log.warning("model %s batch %d: %d of %d requests failed: %r", model.name, batch.batch_id, len(failures),
                batch.size, batch.error)
    for i, request in enumerate(batch.requests):
        error = failures.get(i)
        if error is not None and batch.failures is not None:  # isolated: this input fails on its own
            model.dead_letters.add(request, model.name, error)
        if error is None:
            if not request.future.done():
                request.future.set_result(batch.outputs[i])  # type: ignore[index]
            if request.key is not None:
                _deliver_shared(model, request, batch, batch.outputs[i])  # type: ignore[index]
        else:  # (its riders sent the same input: they fail with it, and nobody else does)
            model.fail(request, InferenceFailed(f"inference failed: {errors.describe(error, 480)}"))
    if model.breaker.record(len(failures) < batch.size, batch.finished_at):
        _open_breaker(model)


def _deliver_shared(model: BatchModel, lead: PendingRequest, batch: Batch, output: Any) -> None:
    """A computed output for the lead's riders (and the cache); nobody attaches to it any more."""
    shared = model.shared
    shared.settle(lead)
    for rider in lead.riders or ():
        rider.batch, rider.bucket, rider.tokens = batch, lead.bucket, lead.tokens  # (for its answer and its log)
        model.deadlines.discard(rider)
        if not rider.future.done():
            rider.future.set_result(output)
    shared.remember(lead, output, batch.finished_at)
    lead.riders = None  # (each rider points at its lead: answered, they must not hold each other)


def _open_breaker(model: BatchModel) -> None:
    """Fail what waits now, quickly, rather than feeding it to a model that fails everything."""
    cooldown_ms = model.config.breaker_cooldown_ms
    log.error("model %s: circuit breaker open for %d ms after repeated failures", model.name, cooldown_ms)
    error = ModelUnavailable(f"model {model.name} is failing; retry later or elsewhere",
                             retry_after_ms=cooldown_ms, reason="breaker_open")
    for request in model.batcher.withdraw_all():
        model.fail(request, error)


def requeue(model: BatchModel, batch: Batch) -> None:
    """A batch the pool gave up on (its worker hung or died): run it again, within the attempts."""
    again = []
    for request in batch.requests:
        if not waited_for(request):
            if request.key is not None:
                model.shared.settle(request)
            continue
        if request.attempts >= model.config.max_batch_attempts:
            model.fail(request, DeadlineExceeded("deadline passed while retrying") if time.monotonic() >= request.deadline
                       else InferenceFailed(f"inference failed: gave up after {request.attempts} attempts"))
            continue
        again.append(request)
    if again:
        model.batcher.requeue_front(again)
