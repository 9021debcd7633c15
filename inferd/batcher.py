"""When a batch leaves the queue, and which worker runs it.

Batches form late: requests leave the queue only when a worker is free to run them, so everything that
arrived while every worker was busy joins the next batch. Three paths hand out batches, all deciding
with the same rule (`_due`) under one lock:

- a worker that finishes a batch takes the next one itself, from its own thread, when one is due; under
  saturation it never waits for the event loop to get round to it;
- `submit` (on the event loop) hands a full batch straight to a parked worker;
- the batcher coroutine (`run`) times the linger for parked workers: it sleeps until the oldest
  waiting request has lingered `max_wait_ms`, or until that request's deadline forces an early flush.

The linger is counted from the oldest waiting request, so a request that already waited while the
workers were busy is not made to wait again.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .messages import Batch, PendingRequest, RequestState
from .request_queue import RequestQueue

if TYPE_CHECKING:
    from .executor import Worker


class QueueFull(Exception):
    """The model already holds `max_queue` waiting requests."""


class Batcher:
    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        loop: asyncio.AbstractEventLoop,
        tiers: Iterable[tuple[str, float | None]] = (("default", None),),
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.expected_compute_s = 0.0  # kept current by the model's stats; used for deadline flushes
        self.flushes: Counter[str] = Counter()  # batches by trigger
        self._loop = loop
        self._lock = threading.Lock()
        self._queue = RequestQueue(tiers)
        self._idle: deque[Worker] = deque()
        self._wake = asyncio.Event()
        self._batch_ids = itertools.count(1)
        self._stopped = False

    # ---- event loop side -------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return self._queue.live

    def depth_by_tier(self) -> dict[str, int]:
        return self._queue.live_by_tier()

    def depth_ahead_of(self, tier: str) -> int:
        """Requests a new request of `tier` would wait behind."""
        return self._queue.live_ahead_of(tier)

    def oldest_age_by_tier(self, now: float) -> dict[str, float]:
        with self._lock:
            return self._queue.oldest_age_by_tier(now)

    def oldest_age_s(self, now: float) -> float:
        with self._lock:
            oldest = self._queue.oldest()
        return now - oldest.enqueued_at if oldest else 0.0

    def submit(self, request: PendingRequest) -> None:
        """Queue a request; raises QueueFull when `max_queue` requests already wait."""
        worker: Worker | None = None
        batch: Batch | None = None
        wake = False
        with self._lock:
            queue = self._queue
            if queue.live >= self.max_queue:
                raise QueueFull
            queue.append(request)
            if self._idle:
                trigger = self._due(request.enqueued_at, "linger")[0]
                if trigger is None:
                    wake = queue.live == 1  # the first waiting request starts the linger clock
                else:
                    batch = self._take(trigger, request.enqueued_at)
                    if batch is not None:
                        worker = self._idle.popleft()
        if worker is not None:
            worker.give(batch)
        elif wake:
            self._wake.set()

    def withdraw(self, request: PendingRequest, new_state: RequestState) -> bool:
        """Remove a request that is still waiting (client gone, deadline passed). False if it left already."""
        with self._lock:
            return self._queue.remove(request, new_state)

    def withdraw_all(self) -> list[PendingRequest]:
        """Remove every waiting request (the model stopped taking work)."""
        with self._lock:
            return list(self._queue.drain())

    def requeue_front(self, requests: list[PendingRequest]) -> None:
        """Put requests of a batch that must run again at the head of the queue."""
        with self._lock:
            self._queue.appendleft(requests)
        self._wake.set()

    def stop(self) -> list[PendingRequest]:
        """Release parked workers and return the requests that were still waiting."""
        with self._lock:
            self._stopped = True
            idle, self._idle = list(self._idle), deque()
            leftover = list(self._queue.drain())
        for worker in idle:
            worker.give(None)
        self._wake.set()
        return leftover

    async def run(self) -> None:
        """The batcher coroutine: flushes by linger (or request deadline) for parked workers."""
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            while not self._stopped:
                now = time.monotonic()
                worker = batch = None
                with self._lock:
                    if not self._idle or not self._queue.live:
                        break
                    trigger, due_at = self._due(now, "linger")
                    if trigger is not None:
                        batch = self._take(trigger, now)
                        if batch is not None:
                            worker = self._idle.popleft()
                if trigger is not None:
                    if worker is not None:
                        worker.give(batch)
                    continue
                # A batch that fills up meanwhile is handed over by `submit`; nothing else makes it due sooner.
                await asyncio.sleep(due_at - now)

    # ---- worker thread side ----------------------------------------------------------------------

    def next_batch(self, worker: Worker) -> Batch | None:
        """Called by a free worker: the next due batch at once, else park until one is handed over.

        Returns None when the batcher stops.
        """
        now = time.monotonic()
        with self._lock:
            if self._stopped:
                return None
            trigger = self._due(now, "idle_worker")[0]
            if trigger is not None:
                batch = self._take(trigger, now)
                if batch is not None:
                    worker.parked = False
                    return batch
            self._idle.append(worker)
            worker.parked_at = now
            needs_timer = self._queue.live > 0
        if needs_timer:
            self._loop.call_soon_threadsafe(self._wake.set)
        worker.parked = True
        return worker.wait_for_batch()

    # ---- the rule (lock held) --------------------------------------------------------------------

    def _due(self, now: float, on_linger: str) -> tuple[str | None, float]:
        """(trigger, when): the trigger if a batch is due now, else None and the time it will be."""
        queue = self._queue
        if queue.live >= self.max_batch_size:
            return "full", now
        oldest = queue.oldest()
        if oldest is None:
            return None, float("inf")
        linger_end = oldest.enqueued_at + self.max_wait_s
        if now >= linger_end:
            return on_linger, now
        # Flush early if lingering on would make the oldest request miss a deadline it can still meet.
        deadline_end = oldest.deadline - self.expected_compute_s
        if deadline_end <= oldest.enqueued_at:
            return None, linger_end  # it cannot be met even at once: lingering changes nothing
        if now >= deadline_end:
            return "deadline", now
        return None, min(linger_end, deadline_end)

    def _take(self, trigger: str, now: float) -> Batch | None:
        requests = self._queue.take(self.max_batch_size, now)
        if not requests:
            return None  # everything due had expired
        self.flushes[trigger] += 1
        return Batch(next(self._batch_ids), requests, trigger, now)
