"""One served model: its queue and batcher, its executor threads, and what it has measured about itself.

This is where a request becomes a `PendingRequest` with a future and a deadline timer, and where a
finished batch resolves those futures on the event loop. Every path (result, backend error, deadline,
client gone, shutdown) resolves a future at most once: all of them go through `done()` guards on the
loop, and the request's queue state decides whether it is still allowed to run.
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
from .batcher import Batcher
from .config import ModelConfig
from .deadlines import DeadlineWheel
from .errors import DeadlineExceeded, InferdError, InferenceFailed
from .executor import Worker
from .messages import Batch, PendingRequest, RequestState
from .metrics import Histogram, RequestMetrics

log = logging.getLogger("inferd.model")

_EWMA_ALPHA = 0.2
BUSY_WINDOW_S = 10.0
DEFAULT_TIER = "default"


class ServedModel:
    def __init__(self, config: ModelConfig, loop: asyncio.AbstractEventLoop, metrics: RequestMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.name = config.name
        self.loop = loop
        self.batcher = Batcher(
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_queue=config.max_queue,
            loop=loop,
        )
        build = partial(_build_for_device, config)
        self.workers = [
            Worker(
                name=f"{config.name}-{i}",
                device=device,
                build=build,
                warmup_inputs=config.warmup_inputs,
                batcher=self.batcher,
                loop=loop,
                on_ready=self._on_worker_ready,
                on_failed=self._on_worker_failed,
                on_batch_done=self._on_batch_done,
            )
            for i, device in enumerate(config.worker_devices)
        ]
        self.deadlines = DeadlineWheel(loop, self._expire)
        self.start_error: BaseException | None = None
        self.batches = 0
        self.requests_computed = 0
        self.compute_ewma_s = 0.0  # measured seconds per backend call
        self.batch_sizes: Counter[int] = Counter()
        self.queue_wait = Histogram()
        self.linger = Histogram()
        self.compute = Histogram()
        self._busy_samples: dict[str, deque[tuple[float, float]]] = {w.name: deque() for w in self.workers}
        self._batcher_task: asyncio.Task | None = None
        self._sampler_task: asyncio.Task | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._batcher_task = self.loop.create_task(self.batcher.run(), name=f"batcher-{self.name}")
        self._sampler_task = self.loop.create_task(self._sample_every_second(), name=f"sampler-{self.name}")
        for worker in self.workers:
            worker.start()

    @property
    def ready(self) -> bool:
        return all(w.ready for w in self.workers)

    @property
    def ready_workers(self) -> int:
        return sum(1 for w in self.workers if w.ready)

    async def stop(self, reason: InferdError, join_timeout_s: float = 2.0) -> None:
        """Stop the workers; requests still waiting get `reason`."""
        for request in self.batcher.stop():
            self._fail(request, reason)
        for worker in self.workers:  # batches still running when the grace period ended
            running = worker.current
            for request in running.requests if running is not None else ():
                self._fail(request, reason)
        if self._sampler_task is not None:
            self._sampler_task.cancel()
        if self._batcher_task is not None:
            await asyncio.gather(self._batcher_task, return_exceptions=True)
        deadline = time.monotonic() + join_timeout_s
        for worker in self.workers:  # a hung backend call must not hold the process: threads are daemons
            await self.loop.run_in_executor(None, worker.join, max(0.0, deadline - time.monotonic()))
        self.deadlines.close()

    # ---- requests --------------------------------------------------------------------------------

    def submit(self, request_id: str, value: Any, timeout_s: float) -> PendingRequest:
        """Queue one input; raises batcher.QueueFull. The caller awaits `.future`."""
        now = time.monotonic()
        request = PendingRequest(request_id, value, now, now + timeout_s, self.loop.create_future())
        self.batcher.submit(request)
        self.deadlines.add(request)
        return request

    def abandon(self, request: PendingRequest) -> None:
        """The client went away: a request still queued is removed and never computed."""
        self.batcher.withdraw(request, RequestState.CANCELLED)
        self.deadlines.discard(request)
        request.future.cancel()

    def _expire(self, request: PendingRequest) -> None:
        left_queue = self.batcher.withdraw(request, RequestState.EXPIRED)
        if not request.future.done():
            queued = left_queue or request.state is RequestState.EXPIRED
            self.metrics.shed[(self.name, DEFAULT_TIER, "deadline_queued" if queued else "deadline_computing")] += 1
            where = "while queued" if queued else "while computing"
            request.future.set_exception(DeadlineExceeded(f"deadline passed {where}"))

    def _fail(self, request: PendingRequest, error: InferdError) -> None:
        self.deadlines.discard(request)
        if not request.future.done():
            request.future.set_exception(error)

    # ---- from the workers (on the loop) ----------------------------------------------------------

    def _on_batch_done(self, batch: Batch) -> None:
        compute = batch.compute_s
        self.compute_ewma_s += _EWMA_ALPHA * (compute - self.compute_ewma_s)
        self.batcher.expected_compute_s = self.compute_ewma_s
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
        if batch.error is not None:
            error = InferenceFailed(f"inference failed: {type(batch.error).__name__}: {batch.error}"[:500])
            log.warning("model %s batch %d (%d requests) failed: %r", self.name, batch.batch_id, batch.size, batch.error)
            for request in batch.requests:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        for request, output in zip(batch.requests, batch.outputs):  # type: ignore[arg-type]
            if not request.future.done():
                request.future.set_result(output)

    def _on_worker_ready(self, worker: Worker) -> None:
        if not self.compute_ewma_s:  # the warm-up call is the first measurement
            self.compute_ewma_s = worker.warmup_s
            self.batcher.expected_compute_s = self.compute_ewma_s
        if self.ready:
            log.info("model %s ready: %d workers", self.name, len(self.workers))

    def _on_worker_failed(self, worker: Worker, error: BaseException) -> None:
        self.start_error = error

    # ---- what it knows about itself --------------------------------------------------------------

    def depth_by_tier(self, now: float) -> tuple[dict[str, int], dict[str, float]]:
        """Waiting requests and the oldest one's age, per tier."""
        return {DEFAULT_TIER: self.batcher.depth}, {DEFAULT_TIER: self.batcher.oldest_age_s(now)}

    def sample_busy(self, now: float) -> None:
        """Called every second or so: keeps a window of each worker's busy time for the busy ratio."""
        for worker in self.workers:
            samples = self._busy_samples[worker.name]
            samples.append((now, worker.busy_total_s(now)))
            while len(samples) > 2 and now - samples[0][0] > BUSY_WINDOW_S:
                samples.popleft()

    async def _sample_every_second(self) -> None:
        while True:
            self.sample_busy(time.monotonic())
            await asyncio.sleep(1.0)

    def busy_ratio(self, worker: Worker, now: float) -> float:
        """Share of the last window (about 10 s) the worker spent inside backend calls: GPU utilisation."""
        samples = self._busy_samples[worker.name]
        if not samples or now - samples[0][0] <= 0:
            return 0.0
        then, busy_then = samples[0]
        return max(0.0, min(1.0, (worker.busy_total_s(now) - busy_then) / (now - then)))

    def capacity_rps(self) -> float:
        """Requests per second the ready workers sustain with full batches at the measured batch time."""
        if not self.compute_ewma_s:
            return 0.0
        return self.ready_workers * self.config.max_batch_size / self.compute_ewma_s

    def predicted_wait_s(self) -> float:
        """How long a request queued now would wait before its batch starts."""
        capacity = self.capacity_rps()
        depth = self.batcher.depth
        if capacity <= 0:
            return math.inf if depth else 0.0
        return depth / capacity

    def retry_after_ms(self) -> int:
        wait = self.predicted_wait_s()
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
            "stats": {
                "batches": self.batches,
                "requests_computed": self.requests_computed,
                "mean_batch_size": round(self.requests_computed / self.batches, 2) if self.batches else 0.0,
                "batch_ms_ewma": round(self.compute_ewma_s * 1000, 3),
                "capacity_rps": round(self.capacity_rps(), 1),
                "queue_depth": self.batcher.depth,
                "predicted_wait_ms": round(min(self.predicted_wait_s(), 1e9) * 1000, 3),
                "flushes": dict(self.batcher.flushes),
                "busy_gap_ms_p50": round(gaps[len(gaps) // 2] * 1000, 3) if gaps else None,
                "batch_sizes": {str(size): n for size, n in sorted(self.batch_sizes.items())},
            },
        }


def _build_for_device(config: ModelConfig, device: str):
    return build_batch_function(config.backend, device, config.options, config.factory)
