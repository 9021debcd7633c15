"""One served model: its queue and batcher, its executor threads, and what it has measured about itself.

This is where a request becomes a `PendingRequest` with a future and a deadline timer, and where a
finished batch resolves those futures on the event loop. Every path (result, backend error, deadline,
client gone, shutdown) resolves a future at most once: all of them go through `done()` guards on the
loop, and the request's queue state decides whether it is still allowed to run.

Faults are handled here too (the decisions themselves live in `faults`): a watchdog gives up on a
worker whose call runs past the hang limit, re-queues its batch at the front and starts a replacement;
a dead worker is handled the same way, and a replacement that fails to start is tried again with
backoff; requests isolated as poison by the worker's bisection fail alone
and go to the dead-letter log; a model that fails everything trips its circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from functools import partial
from typing import Any

from .backends import build_batch_function
from .batcher import Batcher, QueueFull
from .config import ModelConfig, TierConfig
from .deadlines import DeadlineWheel
from .errors import DeadlineExceeded, InferdError, InferenceFailed, InvalidInput, ModelUnavailable, ServiceOverloaded
from .executor import Worker
from .faults import BatchLatencies, BreakerState, CircuitBreaker, DeadLetters
from .messages import Batch, PendingRequest, RequestState
from .metrics import Histogram, RequestMetrics
from .preprocess import Preprocessor

log = logging.getLogger("inferd.model")

_EWMA_ALPHA = 0.2
BUSY_WINDOW_S = 10.0
# A replacement worker that fails to start (a device out of memory a moment, a driver restarting) is
# tried again after this long, doubling up to the maximum, until one starts.
REBUILD_FIRST_S = 1.0
REBUILD_MAX_S = 60.0


class ServedModel:
    def __init__(
        self,
        config: ModelConfig,
        loop: asyncio.AbstractEventLoop,
        metrics: RequestMetrics,
        dead_letters: DeadLetters | None = None,
        tiers: tuple[TierConfig, ...] = (TierConfig("default"),),
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.name = config.name
        self.loop = loop
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_queue=config.max_queue,
            loop=loop,
            tiers=[(t.name, t.promote_after_ms / 1000.0 if t.promote_after_ms else None) for t in tiers],
        )
        self._build = partial(_build_for_device, config)
        self._busy_samples: dict[str, deque[tuple[float, float]]] = {}
        self.workers = [self._new_worker(f"{config.name}-{i}", device) for i, device in enumerate(config.worker_devices)]
        self.deadlines = DeadlineWheel(loop, self._expire)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_ms / 1000.0)
        self.latencies = BatchLatencies(config.batch_timeout_ms / 1000.0)
        self.warmed = False  # every configured worker has been ready once
        self.healthy_workers = 0  # built, warm and not given up on (recounted when a worker changes)
        self.prepare_one: Any = None  # the backend's `prepare(text) -> (input, bucket)`, run on the loop
        self.preprocessor: Preprocessor | None = None  # runs the backend's `prepare_batch` off the loop
        self.output_kind: str | None = None  # the backend's `output_kind` ("embedding": /v1/embeddings)
        self._stop_reason: InferdError | None = None
        self.start_error: BaseException | None = None
        self.replacements = 0
        self.batches = 0
        self.requests_computed = 0
        self.compute_ewma_s = 0.0  # measured seconds per backend call
        self.peak_capacity_rps = 0.0  # the reference the rate limits are scaled against
        self.batch_sizes: Counter[int] = Counter()
        self.queue_wait = Histogram()
        self.linger = Histogram()
        self.compute = Histogram()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.build_failures = 0  # replacement workers that failed to start
        self._rebuild_delay_s: dict[str, float] = {}  # per worker slot ("m-0"): the next retry's delay
        self._rebuild_timers: set[asyncio.TimerHandle] = set()

    def _new_worker(self, name: str, device: str) -> Worker:
        self._busy_samples[name] = deque()
        return Worker(
            name=name,
            device=device,
            build=self._build,
            warmup_inputs=self.config.warmup_inputs,
            batcher=self.batcher,
            loop=self.loop,
            on_ready=self._on_worker_ready,
            on_failed=self._on_worker_failed,
            on_batch_done=self._on_batch_done,
            on_died=self._on_worker_died,
            max_isolation_calls=self.config.max_isolation_calls,
        )

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}"),
            self.loop.create_task(self._sample_every_second(), name=f"sampler-{self.name}"),
            self.loop.create_task(self._watch_for_hangs(), name=f"watchdog-{self.name}"),
        ]
        for worker in self.workers:
            worker.start()

    @property
    def ready(self) -> bool:
        """Serving: all workers were warmed once, one is still healthy, and the breaker is not open."""
        return self.warmed and self.healthy_workers > 0 and self.breaker.state is not BreakerState.OPEN

    @property
    def ready_workers(self) -> int:
        """Healthy workers: built, warm, and not given up on."""
        return self.healthy_workers

    def _count_healthy(self) -> None:
        self.healthy_workers = sum(1 for w in self.workers if w.healthy)

    def unavailable_for_s(self, now: float) -> float | None:
        """While the breaker is open: seconds until it lets a probe through."""
        return self.breaker.refusal_s(now)

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        self._stop_reason = reason  # what a request still being prepared gets when it comes back
        if self.preprocessor is not None:
            for request in self.preprocessor.stop():
                self._fail(request, reason)
        for request in self.batcher.stop():
            self._fail(request, reason)
        for worker in self.workers:  # batches still running when the grace period ended
            running = worker.current
            for request in running.requests if running is not None else ():
                self._fail(request, reason)
        self._stopping = True
        for timer in self._rebuild_timers:
            timer.cancel()
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        deadline = time.monotonic() + join_timeout_s
        for worker in self.workers:  # a hung backend call must not hold the process: threads are daemons
            await self.loop.run_in_executor(None, worker.join, max(0.0, deadline - time.monotonic()))
        self.deadlines.close()

    # ---- requests --------------------------------------------------------------------------------

    def submit(
        self, request_id: str, raw: Any, timeout_s: float, tier: str = "default", tenant: str = "anonymous"
    ) -> PendingRequest:
        """Admit one input: it is prepared (off the loop when the backend has `prepare_batch`), then
        queued. The caller awaits `.future`. Raises InvalidInput or ServiceOverloaded when that is known
        at once; otherwise the future carries it."""
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
        self._enqueue(request)
        self.deadlines.add(request)
        return request

    def _enqueue(self, request: PendingRequest) -> None:
        try:
            self.batcher.submit(request)
        except QueueFull:
            raise ServiceOverloaded(
                f"model {self.name} has {self.config.max_queue} requests waiting",
                retry_after_ms=self.retry_after_ms(request.tier),
                reason="queue_full",
            ) from None

    def _on_prepared(self, requests: list[PendingRequest], results: Any) -> None:
        """Back from the preprocessing thread (on the loop): queue each request that is still waiting."""
        for request, result in zip(requests, results, strict=True):
            if request.state is not RequestState.PREPARING:
                continue  # the client went away or its deadline passed meanwhile
            if self._stop_reason is not None:
                self._fail(request, self._stop_reason)
                continue
            if isinstance(result, BaseException):
                request.state = RequestState.REJECTED
                self._fail(request, self._unreadable(result))
                continue
            request.input, request.bucket = result[0], result[1]
            request.tokens = result[2] if len(result) > 2 else 0
            request.state = RequestState.QUEUED
            try:
                self._enqueue(request)
            except ServiceOverloaded as error:
                request.state = RequestState.REJECTED
                self.metrics.shed[(self.name, request.tier, error.reason)] += 1
                self._fail(request, error)

    def _unreadable(self, exc: BaseException) -> InvalidInput:
        return InvalidInput(f"model {self.name} cannot take this input: {type(exc).__name__}: {exc}"[:300])

    def abandon(self, request: PendingRequest) -> None:
        """The client went away: a request still queued is removed and never computed."""
        if request.state is RequestState.PREPARING:
            request.state = RequestState.CANCELLED
        else:
            self.batcher.withdraw(request, RequestState.CANCELLED)
        self.deadlines.discard(request)
        request.future.cancel()

    def _expire(self, request: PendingRequest) -> None:
        if request.state is RequestState.PREPARING:
            request.state = RequestState.EXPIRED
            left_queue = True
        else:
            left_queue = self.batcher.withdraw(request, RequestState.EXPIRED)
        if not request.future.done():
            queued = left_queue or request.state is RequestState.EXPIRED
            self.metrics.shed[(self.name, request.tier, "deadline_queued" if queued else "deadline_computing")] += 1
            where = "while queued" if queued else "while computing"
            request.future.set_exception(DeadlineExceeded(f"deadline passed {where}"))

    def _fail(self, request: PendingRequest, error: InferdError) -> None:
        self.deadlines.discard(request)
        if not request.future.done():
            request.future.set_exception(error)

    # ---- from the workers (on the loop) ----------------------------------------------------------

    def _on_batch_done(self, batch: Batch) -> None:
        if batch.abandoned:
            return  # the watchdog re-queued these requests; this late result is not delivered
        compute = batch.compute_s
        self.compute_ewma_s += _EWMA_ALPHA * (compute - self.compute_ewma_s)
        self.batcher.expected_compute_s = self.compute_ewma_s
        self.latencies.observe(compute)
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
            if error is None:
                if not request.future.done():
                    request.future.set_result(batch.outputs[i])  # type: ignore[index]
                continue
            if batch.failures is not None:  # isolated: this input fails on its own
                self.dead_letters.add(request, self.name, error)
            if not request.future.done():
                request.future.set_exception(InferenceFailed(f"inference failed: {type(error).__name__}: {error}"[:500]))
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

    # ---- hangs and dead workers (on the loop) ----------------------------------------------------

    async def _watch_for_hangs(self) -> None:
        while True:
            await asyncio.sleep(min(0.05, self.latencies.limit_s / 4))
            now = time.monotonic()
            limit = self.latencies.limit_s
            for worker in list(self.workers):
                started = worker.call_started_at
                if worker.healthy and started and now - started > limit and worker.current is not None:
                    log.error("model %s: worker %s stuck in a call for %.2f s (limit %.2f s); replacing it",
                              self.name, worker.name, now - started, limit)
                    self._give_up_on(worker, worker.current)

    def _on_worker_died(self, worker: Worker, batch: Batch | None, error: BaseException) -> None:
        self._give_up_on(worker, batch)

    def _give_up_on(self, worker: Worker, batch: Batch | None) -> None:
        """Take a worker out of rotation, run its batch again elsewhere, and start a replacement."""
        worker.abandoned = True
        self._count_healthy()
        if batch is not None and not batch.abandoned:
            batch.abandoned = True
            self._requeue(batch.requests)
        self._replace(worker)

    def _replace(self, worker: Worker) -> None:
        """Start a new worker on the same device in `worker`'s place."""
        if self._stopping or worker not in self.workers:
            return
        self.replacements += 1
        replacement = self._new_worker(f"{_slot(worker)}.{self.replacements}", worker.device)
        self.workers[self.workers.index(worker)] = replacement
        self._busy_samples.pop(worker.name, None)
        self._count_healthy()
        replacement.start()

    def _requeue(self, requests: list[PendingRequest]) -> None:
        again = []
        for request in requests:
            if request.future.done():
                continue
            if request.attempts >= self.config.max_batch_attempts:
                self.deadlines.discard(request)
                if time.monotonic() >= request.deadline:
                    request.future.set_exception(DeadlineExceeded("deadline passed while retrying"))
                else:
                    request.future.set_exception(
                        InferenceFailed(f"inference failed: gave up after {request.attempts} attempts")
                    )
                continue
            again.append(request)
        if again:
            self.batcher.requeue_front(again)

    def _on_worker_ready(self, worker: Worker) -> None:
        self._rebuild_delay_s.pop(_slot(worker), None)
        if not self.compute_ewma_s:  # the warm-up call is the first measurement
            self.compute_ewma_s = worker.warmup_s
            self.batcher.expected_compute_s = self.compute_ewma_s
        self._count_healthy()
        if self.preprocessor is None and self.prepare_one is None:  # the same for every worker's backend
            backend = worker.backend
            prepare_batch = getattr(backend, "prepare_batch", None)
            if prepare_batch is not None:
                self.preprocessor = Preprocessor(prepare_batch, self.loop, self._on_prepared, self.name)
            else:
                self.prepare_one = getattr(backend, "prepare", None)
            self.output_kind = getattr(backend, "output_kind", None)
        if not self.warmed and all(w.ready for w in self.workers):
            self.warmed = True
            log.info("model %s ready: %d workers", self.name, len(self.workers))

    def _on_worker_failed(self, worker: Worker, error: BaseException) -> None:
        if not self.warmed:
            self.start_error = error  # the model never came up
            return
        self.build_failures += 1
        if self._stopping:
            return
        delay = self._rebuild_delay_s.get(_slot(worker), REBUILD_FIRST_S)
        self._rebuild_delay_s[_slot(worker)] = min(REBUILD_MAX_S, delay * 2)
        log.error("model %s: replacement worker %s failed to start: %r; trying again in %.0f s",
                  self.name, worker.name, error, delay)

        def rebuild() -> None:
            self._rebuild_timers.discard(timer)
            self._replace(worker)

        timer = self.loop.call_later(delay, rebuild)
        self._rebuild_timers.add(timer)

    # ---- what it knows about itself --------------------------------------------------------------

    def depth_by_tier(self, now: float) -> tuple[dict[str, int], dict[str, float]]:
        """Waiting requests and the oldest one's age, per tier."""
        return self.batcher.depth_by_tier(), self.batcher.oldest_age_by_tier(now)

    def sample_busy(self, now: float) -> None:
        """Called every second or so: keeps a window of each worker's busy time for the busy ratio."""
        for worker in self.workers:
            samples = self._busy_samples.setdefault(worker.name, deque())
            samples.append((now, worker.busy_total_s(now)))
            while len(samples) > 2 and now - samples[0][0] > BUSY_WINDOW_S:
                samples.popleft()

    async def _sample_every_second(self) -> None:
        while True:
            self.sample_busy(time.monotonic())
            await asyncio.sleep(1.0)

    def busy_ratio(self, worker: Worker, now: float) -> float:
        """Share of the last window (about 10 s) the worker spent inside backend calls: GPU utilisation."""
        samples = self._busy_samples.get(worker.name)
        if not samples or now - samples[0][0] <= 0:
            return 0.0
        then, busy_then = samples[0]
        return max(0.0, min(1.0, (worker.busy_total_s(now) - busy_then) / (now - then)))

    def capacity_rps(self) -> float:
        """Requests/s the healthy workers sustain: full batches at the measured batch time, per worker."""
        if not self.compute_ewma_s:
            return 0.0
        capacity = self.ready_workers * self.config.max_batch_size / self.compute_ewma_s
        self.peak_capacity_rps = max(self.peak_capacity_rps, capacity)
        return capacity

    def capacity_scale(self) -> float:
        """Capacity now as a share of the best measured: what rate limits are multiplied by."""
        capacity = self.capacity_rps()
        return capacity / self.peak_capacity_rps if self.peak_capacity_rps else 1.0

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None) -> float:
        """How long a request of `tier` (default: the lowest) queued now would wait before its batch starts:
        until a worker frees, then one batch time per full round of the requests ahead of it."""
        healthy = self.healthy_workers
        batch_s = self.compute_ewma_s
        if healthy == 0 or not batch_s:
            return math.inf if self.batcher.depth else 0.0
        ahead = self.batcher.depth if tier is None else self.batcher.depth_ahead_of(tier)
        first_free = 0.0
        for worker in self.workers:  # the soonest a healthy worker is free: 0 if one is free now
            running = worker.current
            if running is None and worker.healthy:
                break
            if running is not None and worker.healthy:
                if now is None:
                    now = time.monotonic()
                left = batch_s - (now - running.started_at)
                if left <= 0.0:
                    break
                first_free = left if first_free == 0.0 else min(first_free, left)
        else:
            return first_free + ahead // (self.config.max_batch_size * healthy) * batch_s
        return ahead // (self.config.max_batch_size * healthy) * batch_s

    def retry_after_ms(self, tier: str | None = None) -> int:
        wait = self.predicted_wait_s(tier)
        if math.isinf(wait):
            return 1000
        return max(1, min(60_000, math.ceil(wait * 1000)))

    def describe(self) -> dict[str, Any]:
        c = self.config
        gaps = sorted(g for w in self.workers for g in w.busy_gaps_s)
        return {
            "name": c.name,
            "backend": c.backend,
            "max_batch_size": c.max_batch_size,
            "max_wait_ms": c.max_wait_ms,
            "workers": len(self.workers),
            "devices": list(c.worker_devices),
            "max_queue": c.max_queue,
            "timeout_ms": c.timeout_ms,
            "max_timeout_ms": c.max_timeout_ms,
            "ready": self.ready,
            "ready_workers": self.ready_workers,
            "breaker": self.breaker.state.value,
            "workers_replaced": self.replacements,
            "worker_build_failures": self.build_failures,
            "batch_timeout_ms": round(self.latencies.limit_s * 1000, 1),
            "output_kind": self.output_kind,
            "warmup": {w.name: w.warmup_report for w in self.workers if w.ready},
            "stats": {
                "batches": self.batches,
                "requests_computed": self.requests_computed,
                "mean_batch_size": round(self.requests_computed / self.batches, 2) if self.batches else 0.0,
                "batch_ms_ewma": round(self.compute_ewma_s * 1000, 3),
                "capacity_rps": round(self.capacity_rps(), 1),
                "queue_depth": self.batcher.depth,
                "predicted_wait_ms": round(min(self.predicted_wait_s(), 1e9) * 1000, 3),
                "flushes": dict(self.batcher.flushes),
                "echo_holds": self.batcher.echo_holds,
                "busy_gap_ms_p50": round(gaps[len(gaps) // 2] * 1000, 3) if gaps else None,
                "batch_sizes": {str(size): n for size, n in sorted(self.batch_sizes.items())},
                "preprocess_calls": self.preprocessor.calls if self.preprocessor else 0,
                "preprocess_mean_batch": round(self.preprocessor.items / self.preprocessor.calls, 2)
                if self.preprocessor and self.preprocessor.calls else None,
            },
        }


def _slot(worker: Worker) -> str:
    """The configured worker a replacement stands in for: "m-0" for "m-0", "m-0.3"..."""
    return worker.name.split(".")[0]


def _build_for_device(config: ModelConfig, device: str):
    return build_batch_function(config.backend, device, config.options, config.factory)
