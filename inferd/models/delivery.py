"""Where a finished batch becomes answers: each request's future (and its riders') resolved on the
event loop, what the batch taught the cost model, the hang limit and the breaker, and what happens to a
batch the pool gave up on. Every path resolves a future at most once (`done()` guards).

`Delivery` is owned by its `BatchModel` and holds what it writes (`stats`, read by reports); the parts it
only feeds are handed to it when the model is built.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import errors
from ..config import ModelConfig
from ..errors import DeadlineExceeded, InferdError, InferenceFailed, ModelUnavailable
from ..execution.breaker import CircuitBreaker
from ..execution.hang_limit import HangLimit
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


class Delivery:
    """Answers one batch model's finished batches, and sends back the ones its pool gave up on."""

    def __init__(
        self, config: ModelConfig, *, shared: SharedWork, batcher: Batcher, deadlines: DeadlineWheel,
        forecast: Forecast, timeliness: Timeliness, hang_limit: HangLimit, breaker: CircuitBreaker,
        dead_letters: DeadLetters, tracing: Tracing | None, healthy_workers: Callable[[], int],
        fail: Callable[[PendingRequest, InferdError], None],
    ) -> None:
        self.name = config.name
        self.config = config
        self.shared = shared
        self.batcher = batcher
        self.deadlines = deadlines
        self.forecast = forecast
        self.timeliness = timeliness
        self.hang_limit = hang_limit
        self.breaker = breaker
        self.dead_letters = dead_letters
        self.tracing = tracing
        self.healthy_workers = healthy_workers
        self.fail = fail  # the model's one way to fail a computation and its riders
        self.stats = BatchStats()  # what its batches have been (reports read it)

    def batch_done(self, batch: Batch) -> None:
        """Answer a batch's requests (and their riders), and learn from how it went."""
        if batch.abandoned:
            return  # the pool gave up on it and its requests went back to the queue: not delivered
        self._answer(batch)
        batch.delivered()


    def _answer(self, batch: Batch) -> None:
        compute = batch.compute_s
        # An answer's lateness is against the later of its predicted answer and its predicted start plus the
        # batch that really formed, as estimated before it is learned from (`Lateness`).
        expected_s = self.forecast.settled_batch_cost_s(batch.size, batch.bucket)
        # (a failed batch's time holds its bisection's extra calls: it says nothing of what a batch costs)
        self.forecast.observe_batch(compute, batch.size if batch.error is None else 0, batch.bucket,
                                     batch.backlog, batch.gap_s, batch.finished_at)
        self.forecast.note_capacity(self.healthy_workers())
        self.hang_limit.observe(compute)
        self.stats.record(batch)
        observe_wait, started, discard = self.stats.queue_wait.observe, batch.started_at, self.deadlines.discard
        for request in batch.requests:
            request.batch = batch
            waited = started - request.enqueued_at
            observe_wait(waited)
            discard(request)
            if request.predicted_wait is not None:
                self.timeliness.observe_wait_error(request.tier, waited - request.predicted_wait)
                if request.predicted_start is not None and expected_s is not None:
                    predicted = max(request.predicted_done, request.predicted_start + expected_s)
                    self.timeliness.lateness.observe(batch.finished_at - predicted, batch.finished_at)
        if self.tracing is not None:
            self.tracing.batch(batch, self.name)
        outputs = batch.outputs
        if batch.error is None:
            assert outputs is not None  # (a batch without an error has its outputs: `execution.worker`)
            self.breaker.record(True, batch.finished_at)
            shared = self.shared
            cache = shared.cache
            for request, output in zip(batch.requests, outputs, strict=False):
                if not request.future.done():
                    request.future.set_result(output)
                if request.key is not None:
                    if request.riders or cache is not None:
                        self._deliver_shared(request, batch, output)
                    else:
                        shared.settle(request)
            return
        failures = batch.failures if batch.failures is not None else dict.fromkeys(range(batch.size), batch.error)
        log.warning("model %s batch %d: %d of %d requests failed: %r", self.name, batch.batch_id, len(failures),
                    batch.size, batch.error)
        for i, request in enumerate(batch.requests):
            error = failures.get(i)
            if error is not None and batch.failures is not None:  # isolated: this input fails on its own
                self.dead_letters.add(request, self.name, error)
            if error is None:
                assert outputs is not None  # (a request that did not fail has its output)
                if not request.future.done():
                    request.future.set_result(outputs[i])
                if request.key is not None:
                    self._deliver_shared(request, batch, outputs[i])
            else:  # (its riders sent the same input: they fail with it, and nobody else does)
                self.fail(request, InferenceFailed(f"inference failed: {errors.describe(error, 480)}"))
        if self.breaker.record(len(failures) < batch.size, batch.finished_at):
            self._open_breaker()


    def _deliver_shared(self, lead: PendingRequest, batch: Batch, output: Any) -> None:
        """A computed output for the lead's riders (and the cache); nobody attaches to it any more."""
        shared = self.shared
        shared.settle(lead)
        for rider in lead.riders or ():
            rider.batch, rider.bucket, rider.tokens = batch, lead.bucket, lead.tokens  # (for its answer and its log)
            self.deadlines.discard(rider)
            if not rider.future.done():
                rider.future.set_result(output)
        shared.remember(lead, output, batch.finished_at)
        lead.riders = None  # (each rider points at its lead: answered, they must not hold each other)


    def lost(self, batches: list[Batch], retry_after_s: float) -> None:
        """Batches of a worker that died again soon after its slot's last death (the pool starts its
        replacement `retry_after_s` later): their requests fail at once rather than wait for it or run
        into the same death; with no worker left, so does everything waiting."""
        error = ModelUnavailable(f"model {self.name}: its worker died; retry later or elsewhere",
                                 retry_after_ms=errors.retry_after_ms(retry_after_s), reason="worker_died")
        for batch in batches:
            for request in batch.requests:
                self.fail(request, error)
        if not self.healthy_workers():
            for request in self.batcher.withdraw_all():
                self.fail(request, error)

    def _open_breaker(self) -> None:
        """Fail what waits now, quickly, rather than feeding it to a model that fails everything."""
        cooldown_ms = self.config.breaker_cooldown_ms
        log.error("model %s: circuit breaker open for %d ms after repeated failures", self.name, cooldown_ms)
        error = ModelUnavailable(f"model {self.name} is failing; retry later or elsewhere",
                                 retry_after_ms=cooldown_ms, reason="breaker_open")
        for request in self.batcher.withdraw_all():
            self.fail(request, error)


    def requeue(self, batch: Batch) -> None:
        """A batch the pool gave up on (its worker hung or died): run it again, within the attempts."""
        again = []
        for request in batch.requests:
            if not waited_for(request):
                if request.key is not None:
                    self.shared.settle(request)
                continue
            if request.attempts >= self.config.max_batch_attempts:
                self.fail(request, DeadlineExceeded("deadline passed while retrying") if time.monotonic() >= request.deadline
                           else InferenceFailed(f"inference failed: gave up after {request.attempts} attempts"))
                continue
            again.append(request)
        if again:
            self.batcher.requeue_front(again)
