"""A model's executor threads: starting them, noticing when one hangs or dies, replacing it, and how
busy each one is.

A watchdog gives up on a worker whose call runs past the hang limit (`HangLimit`); a worker whose
thread died is given up on the same way. Its batch goes back to the model (`on_requeue`) and a
replacement starts on the same device; a replacement that fails to start (a device out of memory a
moment, a driver restarting) is tried again after 1 s, then 2, 4... up to 60 s, until one starts.

A replacement that dies within a minute of its start is dying the same way as the worker before it (a
fault that kills every worker at once, the scheduler's or the backend's): the next one waits 1 s, then
2, 4... up to 60 s (one that lives a minute starts the count again), and what it held is given up on
(`on_lost`: failed at once, with what waits when no worker is left) instead of running again into the
same death. Before this, such a fault replaced its worker ~500 times in 45 s, each rebuilding the model.

What becomes of requests is not the pool's business: it reports through the callbacks it is given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..backends import BatchBackend, Capabilities
from ..messages import Batch
from ..observability.snapshots import WorkerSnapshot
from .hang_limit import HangLimit
from .worker import NextBatch, Worker

log = logging.getLogger("inferd.pool")

BUSY_WINDOW_S = 10.0
REBUILD_FIRST_S = 1.0
REBUILD_MAX_S = 60.0
DEATHS_WINDOW_S = 60.0  # a replacement dying this soon after its start dies as the one before it (see the docstring)


class WorkerPool:
    """The workers of one model, one per configured device."""

    def __init__(
        self,
        *,
        name: str,
        devices: Sequence[str],
        build: Callable[[str], BatchBackend],
        warmup_inputs: Sequence[object],
        next_batch: NextBatch,
        loop: asyncio.AbstractEventLoop,
        hang_limit: HangLimit,
        on_batch_done: Callable[[Batch], None],
        on_requeue: Callable[[Batch], None],
        on_ready: Callable[[Worker], None],
        on_lost: Callable[[list[Batch], float], None] = lambda batches, retry_after_s: None,
        max_isolation_calls: int = 32,
        max_batch_size: int = 1,
        worker_nice: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.loop = loop
        self.hang_limit = hang_limit
        self._build = build
        self._warmup_inputs = warmup_inputs
        self._next_batch = next_batch
        self._on_batch_done = on_batch_done
        self._on_requeue = on_requeue
        self._on_ready = on_ready
        self._on_lost = on_lost  # (batches given up on for good, how long until a replacement starts)
        self._clock = clock  # its workers' clock: their calls' times, and when workers die and are replaced (fake in tests)
        self._max_isolation_calls = max_isolation_calls
        self._max_batch_size = max_batch_size
        self._worker_nice = worker_nice
        self._busy_samples: dict[str, deque[tuple[float, float]]] = {}
        self.workers = [self._new_worker(f"{name}-{i}", device) for i, device in enumerate(devices)]
        self.healthy = 0  # built, warm and not given up on (recounted when a worker changes)
        self.warmed = False  # every configured worker has been ready once
        self.start_error: BaseException | None = None  # why the pool never came up
        self.replacements = 0
        self.build_failures = 0  # replacement workers that failed to start
        self.deaths = 0  # workers whose thread died (an exception out of the serve loop)
        self.repeated_deaths = 0  # ... of them, replacements within DEATHS_WINDOW_S of their start
        self._replaced_at: dict[str, float] = {}  # per worker slot: when its latest replacement started
        self._death_delay_s: dict[str, float] = {}  # per worker slot: the wait after its next repeated death
        self._rebuild_delay_s: dict[str, float] = {}  # per worker slot ("m-0"): the next retry's delay
        self._rebuild_timers: set[asyncio.TimerHandle] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def _new_worker(self, name: str, device: str) -> Worker:
        self._busy_samples[name] = deque()
        return Worker(
            name=name, device=device, build=self._build, warmup_inputs=self._warmup_inputs,
            next_batch=self._next_batch, loop=self.loop, on_ready=self._worker_ready, on_failed=self._worker_failed,
            on_batch_done=self._on_batch_done, on_died=self._worker_died, max_isolation_calls=self._max_isolation_calls,
            max_batch_size=self._max_batch_size, nice=self._worker_nice, clock=self._clock,
        )

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            self.loop.create_task(self._sample_every_second(), name=f"busy-sampler-{self.name}"),
            self.loop.create_task(self._watch_for_hangs(), name=f"watchdog-{self.name}"),
        ]
        for worker in self.workers:
            worker.start()

    async def stop(self, join_timeout_s: float = 2.0) -> None:
        """Stop watching and replacing, then wait (bounded) for the threads to finish their calls."""
        self._stopping = True
        for timer in self._rebuild_timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        deadline = time.monotonic() + join_timeout_s
        for worker in self.workers:  # a hung backend call must not hold the process: threads are daemons
            await self.loop.run_in_executor(None, worker.join, max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        """After `stop`: close and forget what the workers built (a model's weights), so its memory can go."""
        for worker in self.workers:
            close = worker.capabilities.close
            if close is not None and worker.backend is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - its memory goes all the same once it is forgotten
                    log.exception("model %s: worker %s's backend failed to close", self.name, worker.name)
            worker.backend, worker.capabilities, worker.ready = None, Capabilities(), False
        self._count_healthy()

    def running(self) -> list[Batch]:
        """The batches inside backend calls now (a pipelined worker's launched one behind it too)."""
        running = [batch for w in self.workers if (batch := w.current) is not None]  # (read once: a worker changes it)
        return running + [batch for w in self.workers if (batch := w.behind) is not None and batch not in running]

    # ---- from the workers (on the loop) ----------------------------------------------------------

    def _worker_ready(self, worker: Worker) -> None:
        self._rebuild_delay_s.pop(_slot(worker), None)
        self._count_healthy()
        if not self.warmed and all(w.ready for w in self.workers):
            self.warmed = True
            log.info("model %s ready: %d workers", self.name, len(self.workers))
        self._on_ready(worker)

    def _worker_failed(self, worker: Worker, error: BaseException) -> None:
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
        self._replace_later(worker, delay)

    def _replace_later(self, worker: Worker, delay_s: float) -> None:
        def rebuild() -> None:
            self._rebuild_timers.discard(timer)
            self._replace(worker)

        timer = self.loop.call_later(delay_s, rebuild)
        self._rebuild_timers.add(timer)

    def _worker_died(self, worker: Worker, batch: Batch | None, error: BaseException) -> None:
        self.deaths += 1
        slot, now = _slot(worker), self._clock()
        started = self._replaced_at.get(slot)
        if started is None or now - started >= DEATHS_WINDOW_S:  # (the first worker, or one that lived a minute)
            self._death_delay_s.pop(slot, None)
            self._give_up_on(worker, batch)  # replaced at once, its batch runs again
            return
        self.repeated_deaths += 1
        delay = self._death_delay_s.get(slot, REBUILD_FIRST_S)
        self._death_delay_s[slot] = min(REBUILD_MAX_S, delay * 2)
        log.error("model %s: replacement worker %s died %.1f s after it started (%d deaths); what it held fails, "
                  "and the next one starts in %.0f s", self.name, worker.name, now - started, self.deaths, delay)
        worker.abandoned = True
        self._count_healthy()
        lost = [b for b in (batch, worker.behind) if b is not None and not b.abandoned]
        for b in lost:
            b.abandoned = True  # its results, if they ever come, are discarded
        self._on_lost(lost, delay)
        self._replace_later(worker, delay)

    async def _watch_for_hangs(self) -> None:
        while True:
            await asyncio.sleep(min(0.05, self.hang_limit.limit_s / 4))
            now = self._clock()  # (the workers' clock: `call_started_at`)
            limit = self.hang_limit.limit_s
            for worker in list(self.workers):
                started = worker.call_started_at
                if worker.healthy and started and now - started > limit and worker.current is not None:
                    log.error("model %s: worker %s stuck in a call for %.2f s (limit %.2f s); replacing it",
                              self.name, worker.name, now - started, limit)
                    self._give_up_on(worker, worker.current)

    def _give_up_on(self, worker: Worker, batch: Batch | None) -> None:
        """Take a worker out of rotation, hand its batch back (and the one launched behind it), and start
        a replacement."""
        worker.abandoned = True
        self._count_healthy()
        for lost in (batch, worker.behind):
            if lost is not None and not lost.abandoned:
                lost.abandoned = True  # its results, if they ever come, are discarded
                self._on_requeue(lost)
        self._replace(worker)

    def _replace(self, worker: Worker) -> None:
        """Start a new worker on the same device in `worker`'s place."""
        if self._stopping or worker not in self.workers:
            return
        self.replacements += 1
        self._replaced_at[_slot(worker)] = self._clock()
        replacement = self._new_worker(f"{_slot(worker)}.{self.replacements}", worker.device)
        self.workers[self.workers.index(worker)] = replacement
        self._busy_samples.pop(worker.name, None)
        self._count_healthy()
        replacement.start()

    def _count_healthy(self) -> None:
        self.healthy = sum(1 for w in self.workers if w.healthy)

    # ---- what it knows -----------------------------------------------------------------------------

    def first_free_s(self, now: float, batch_s: Callable[[Batch], float]) -> float:
        """How soon a healthy worker is free: 0 when one is free now, else the least time left of the
        running batches, each expected to take `batch_s(batch)` in all."""
        first = None
        for worker in self.workers:
            if not worker.healthy:
                continue
            running = worker.current
            if running is None:
                return 0.0
            left = max(0.0, batch_s(running) - (now - (running.started_at or running.formed_at)))  # (handed, not begun)
            behind = worker.behind
            if behind is not None and behind is not running:  # (pipelined: the batch launched behind it goes next)
                left += batch_s(behind)
            first = left if first is None else min(first, left)
        return first or 0.0

    def sample_busy(self, now: float) -> None:
        """Called every second or so: keeps a window of each worker's busy time for the busy ratio."""
        for worker in self.workers:
            samples = self._busy_samples.setdefault(worker.name, deque())
            samples.append((now, worker.busy_total_s(now)))
            while len(samples) > 2 and now - samples[0][0] > BUSY_WINDOW_S:
                samples.popleft()

    async def _sample_every_second(self) -> None:
        while True:
            self.sample_busy(self._clock())  # (the workers' clock: their batches' times)
            await asyncio.sleep(1.0)

    def busy_ratio(self, worker: Worker, now: float) -> float:
        """Share of the last window (about 10 s) the worker spent inside backend calls: GPU utilisation."""
        samples = self._busy_samples.get(worker.name)
        if not samples or now - samples[0][0] <= 0:
            return 0.0
        then, busy_then = samples[0]
        return max(0.0, min(1.0, (worker.busy_total_s(now) - busy_then) / (now - then)))

    def snapshot(self, now: float) -> tuple[WorkerSnapshot, ...]:
        return tuple(
            WorkerSnapshot(w.name, self.busy_ratio(w, now), running.size if (running := w.current) is not None else 0)
            for w in self.workers
        )


def _slot(worker: Worker) -> str:
    """The configured worker a replacement stands in for: "m-0" for "m-0", "m-0.3"..."""
    return worker.name.split(".")[0]
