"""One simulated inferd replica: the server's own scheduling code on a virtual clock.

The batcher, the cost model, the forecast and admission (`Timeliness`) are the classes a real batch
model runs; only the device is a cost function (seconds a batch of n inputs of a length bucket takes,
the simulated GPU's) and the worker is an event of the fleet's clock. A replica answers each request
it takes, refuses what admission refuses (503), and drops what expires while queued (504), as the
server does; what its batches took teaches its cost model as delivery teaches a real one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from ..config import ModelConfig, TierConfig
from ..messages import Batch, Client, PendingRequest, RequestState
from ..models.forecast import Forecast
from ..models.timeliness import Timeliness
from ..scheduling.batch_costs import BatchCosts
from ..scheduling.batcher import Batcher, QueueFull

Device = Callable[[int, int], float]  # (batch size, length bucket) -> seconds


@dataclass(frozen=True)
class SimDevice:
    """The simulated GPU: `latency_ms` a call, plus `per_item_ms` an input, times its bucket's factor
    (a long bucket's inputs cost more)."""

    latency_ms: float = 50.0
    per_item_ms: float = 0.0
    bucket_factors: tuple[float, ...] = (1.0,)

    def __call__(self, size: int, bucket: int) -> float:
        factor = self.bucket_factors[min(bucket, len(self.bucket_factors) - 1)]
        return factor * (self.latency_ms + self.per_item_ms * size) / 1000.0


class VirtualClock:
    """The fleet's time, read by every replica's scheduling code."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _NoLoop:
    """The batcher's event loop, of which it only asks to be woken: the fleet asks it (`dispatch`) instead."""

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        return None


class _OneWorker:
    """What admission reads of a model's workers: one healthy worker and the batch it runs."""

    def __init__(self) -> None:
        self.healthy = 1
        self.current: Batch | None = None

    def running(self) -> list[Batch]:
        return [] if self.current is None else [self.current]

    def first_free_s(self, now: float, batch_s: Callable[[Batch], float]) -> float:
        running = self.current
        return 0.0 if running is None else max(0.0, batch_s(running) - (now - running.started_at))


@dataclass(slots=True)
class Outcome:
    """What became of one request."""

    arrived: float
    slo_s: float
    tier: str
    done: float | None = None  # answered at
    refused: bool = False
    served_by: str | None = None  # the replica that admitted it

    @property
    def in_slo(self) -> bool:
        return self.done is not None and self.done - self.arrived <= self.slo_s + 1e-9


@dataclass
class ReplicaStats:
    busy_s: float = 0.0  # time in backend calls
    batches: int = 0
    answered: int = 0
    refused: int = 0


class Replica:
    """One inferd process with one worker serving one batch model (see the module docstring)."""

    def __init__(self, name: str, config: ModelConfig, device: Device, clock: VirtualClock,
                 schedule: Callable[[float, Callable[[], None]], None],
                 tiers: tuple[TierConfig, ...] = (TierConfig("default"),), buckets: int = 1) -> None:
        self.name = name
        self.config = config
        self.device = device
        self.clock = clock
        self._schedule = schedule  # (when, what): the fleet's event queue
        slo = config.slo_ms / 1000.0 if config.slo_ms else None
        self.costs = BatchCosts(config.max_batch_size, slo)
        self.forecast = Forecast(self.costs)
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms, max_queue=config.max_queue,
            loop=cast(Any, _NoLoop()), tiers=[(t.name, t.promote_after_ms / 1000.0 if t.promote_after_ms else None) for t in tiers],
            batch_time_s=lambda: self.forecast.batch_s, costs=self.costs, max_batch_tokens=config.max_batch_tokens,
            linger_s=partial(self.forecast.linger_s, config.max_wait_ms, config.slo_ms), clock=clock)
        self.worker = _OneWorker()
        self.timeliness = Timeliness(config, tiers, self.forecast, self.batcher, cast(Any, self.worker))
        self.stats = ReplicaStats()
        self.outstanding = 0  # taken and not yet answered, refused or expired (what a leastconn balancer counts)
        self._outcomes: dict[int, Outcome] = {}
        self._timer_at = math.inf
        self._finished: Sequence[Client | None] = ()  # the connections the worker's batch just answered
        for bucket in range(buckets):  # the warm-up: each bucket's smallest and largest batch, as a worker's
            for size in (1, config.max_batch_size):
                self.forecast.observe_batch(device(size, bucket), size, bucket, at=clock.now)
        self._ask_for_work()

    # ---- requests ----------------------------------------------------------------------------------

    def offer(self, request: PendingRequest, outcome: Outcome) -> bool:
        """Admit `request` or refuse it (False: a 503), as a batch model's intake does."""
        now = self.clock.now
        timeliness = self.timeliness
        if timeliness.asks(request, now) and timeliness.refusal(request, now, request.bucket) is not None:
            outcome.refused = True
            self.stats.refused += 1
            return False
        self._outcomes[id(request)] = outcome
        self.outstanding += 1
        try:
            shed = self.batcher.submit(request)
        except QueueFull:
            del self._outcomes[id(request)]
            self.outstanding -= 1
            outcome.refused = True
            self.stats.refused += 1
            return False
        outcome.served_by = self.name
        if shed is not None:
            self._drop(shed, refused=True)
        if self.batcher.woken():  # decide only where the coroutine would be woken (a full batch went in `submit`)
            self._tick()
        return True

    def _drop(self, request: PendingRequest, refused: bool = False) -> None:
        outcome = self._outcomes.pop(id(request), None)
        if outcome is not None:
            self.outstanding -= 1
            if refused:
                outcome.refused = True
                self.stats.refused += 1

    # ---- the worker ----------------------------------------------------------------------------------

    def _ask_for_work(self) -> None:
        batch = self.batcher.next_batch(self._finished, self._start)
        self._finished = ()
        if batch is not None:
            self._start(batch)

    def _start(self, batch: Batch | None) -> None:
        if batch is None:
            return
        now = self.clock.now
        batch.started_at = now
        self.worker.current = batch
        self._schedule(now + self.device(batch.size, batch.bucket), partial(self._done, batch))

    def _done(self, batch: Batch) -> None:
        now = self.clock.now
        batch.finished_at = now
        self.worker.current = None
        compute = batch.compute_s
        self.stats.busy_s += compute
        self.stats.batches += 1
        expected_s = self.forecast.settled_batch_cost_s(batch.size, batch.bucket)  # (as delivery: what lateness is against)
        self.forecast.observe_batch(compute, batch.size, batch.bucket, batch.backlog, None, now)
        # What delivery does that decides anything later: the lateness bounds admission's margin. (Not the
        # wait error's histogram nor the capacity rate limits scale by: nothing here reads them.)
        outcome_of, observe_lateness = self._outcomes.pop, self.timeliness.lateness.observe
        answered = 0
        for request in batch.requests:
            outcome = outcome_of(id(request), None)
            if outcome is not None:
                outcome.done = now
                answered += 1
            predicted_start = request.predicted_start
            if predicted_start is not None and expected_s is not None:  # (set with the predicted wait)
                observe_lateness(now - max(request.predicted_done, predicted_start + expected_s), now)
        self.outstanding -= answered
        self.stats.answered += answered
        self._finished = batch.clients()
        self._ask_for_work()
        self._tick()

    def _tick(self) -> None:
        """Hand a due batch to the parked worker, and time the next linger: what the batcher's coroutine
        does when woken (a worker parking, a request that may make a bucket due sooner) or when its sleep
        ends (at the next due, or in a second at most)."""
        now = self.clock.now
        due_at = self.batcher.dispatch(now)
        if due_at is not None and due_at < self._timer_at:
            self._timer_at = max(min(due_at, now + 1.0), now + 1e-6)
            self._schedule(self._timer_at, self._on_timer)

    def _on_timer(self) -> None:
        if self.clock.now + 1e-9 >= self._timer_at:
            self._timer_at = math.inf
        self._tick()


    def expire(self, request: PendingRequest) -> None:
        """A request's deadline passed: withdrawn if it still waits (a 504), as the deadline wheel does."""
        if request.state is RequestState.QUEUED:
            self.batcher.withdraw(request, RequestState.EXPIRED)
        if request.state is RequestState.EXPIRED:
            self._drop(request)

    @property
    def depth(self) -> int:
        return self.batcher.depth

    def predicted_wait_s(self) -> float:
        """What `inferd_predicted_wait_seconds` reports: the wait of a request of the lowest tier queued now."""
        return self.timeliness.wait_and_ahead(None, self.clock.now)[0]
