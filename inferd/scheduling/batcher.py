"""When a batch leaves the queue, and who takes it.

Batches form late: requests leave the queue only when a worker is free to run them, so everything that
arrived while every worker was busy joins the next batch. Three paths hand out batches, all deciding
with the same rule (`_due`) under one lock:

- a worker that finishes a batch asks for the next one itself (`next_batch`), from its own thread; when
  one is due it gets it at once, so under saturation it never waits for the event loop; when none is,
  it leaves a taker (a callable that hands it a batch) and parks;
- `submit` (on the event loop) hands a full batch straight to a parked taker;
- the batcher coroutine (`run`) times the linger for parked takers: it sleeps until the oldest
  waiting request has lingered `max_wait_ms`, or until that request's deadline forces an early flush.

The batcher knows takers only as callables: who they are (executor threads) is not its business.

The linger is counted from the oldest waiting request, so a request that already waited while the
workers were busy is not made to wait again. One exception: closed-loop clients (each sends again as
soon as it is answered) whose number is near the batch size can split into two groups whose batches
alternate half full, forever, since each group is stale when a worker frees. The batcher watches for
that echo: when most of a finished batch's requests come back within `max_wait_ms` of it and the rest
of the cycle is quiet, a worker that frees with a stale, partial queue waits up to `max_wait_ms` for
the echo of the batch it just finished, so the groups merge. Open-loop traffic arrives at the same rate
inside and outside that window, so it is never held.

Requests carry a bucket key (e.g. a token-length bucket, from the backend's `prepare`); each bucket
has its own queue and a batch never mixes buckets. A full bucket goes first, otherwise the bucket
holding the oldest request.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable

from ..messages import Batch, PendingRequest, RequestState
from .request_queue import RequestQueue

Taker = Callable[[Batch | None], None]  # hands a parked worker its batch (None: stop); any thread

ECHO_SCORE_TO_HOLD = 0.5  # the EWMA of "this cycle echoed" past which a worker waits for the echo
_ECHO_ALPHA = 0.3


class QueueFull(Exception):
    """The model already holds `max_queue` waiting requests."""


class Batcher:
    """One model's queues (one per length bucket) and the rule that turns them into batches.

    `batch_time_s` tells how long a batch is expected to take (for deadline flushes); `clock` is
    injectable so the rule can be tested on a fake clock."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        loop: asyncio.AbstractEventLoop,
        tiers: Iterable[tuple[str, float | None]] = (("default", None),),
        batch_time_s: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.flushes: Counter[str] = Counter()  # batches by trigger
        self._batch_time_s = batch_time_s
        self._clock = clock
        self._loop = loop
        self._lock = threading.Lock()
        self._tiers = list(tiers)
        self._single_tier = len(self._tiers) == 1
        self._queues: dict[int, RequestQueue] = {0: RequestQueue(self._tiers)}  # by bucket
        self._depth = 0  # live requests over every bucket
        self._takers: deque[Taker] = deque()  # parked workers, first parked first served
        self._wake = asyncio.Event()
        self._batch_ids = itertools.count(1)
        self._stopped = False
        # The echo of finished batches (see the module docstring), all under the lock.
        self.echo_score = 0.0
        self.echo_holds = 0
        self._hold_until = 0.0
        self._cycle_start = 0.0  # when the last batch finished
        self._cycle_size = 0  # how many requests it answered
        self._arrived_in_window = 0  # arrivals within max_wait of that...
        self._arrived_after = 0  # ...and after, until the next batch finished

    # ---- event loop side -------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting for a batch (kept as a count: read per request by admission)."""
        return self._depth

    def depth_by_tier(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for q in self._queues.values():
            totals.update(q.live_by_tier())
        return dict(totals)

    def depth_ahead_of(self, tier: str) -> int:
        """Requests a new request of `tier` would wait behind."""
        if self._single_tier:
            return self._depth
        return sum(q.live_ahead_of(tier) for q in self._queues.values())

    def oldest_age_by_tier(self, now: float) -> dict[str, float]:
        ages: dict[str, float] = {}
        with self._lock:
            for q in self._queues.values():
                for tier, age in q.oldest_age_by_tier(now).items():
                    ages[tier] = max(age, ages.get(tier, 0.0))
        return ages

    def submit(self, request: PendingRequest) -> None:
        """Queue a request; raises QueueFull when `max_queue` requests already wait."""
        taker: Taker | None = None
        batch: Batch | None = None
        wake = False
        with self._lock:
            if self._depth >= self.max_queue:
                raise QueueFull
            queue = self._queues.get(request.bucket)
            if queue is None:
                queue = self._queues[request.bucket] = RequestQueue(self._tiers)
            queue.append(request)
            self._depth += 1
            if self._cycle_start:
                if request.enqueued_at - self._cycle_start <= self.max_wait_s:
                    self._arrived_in_window += 1
                else:
                    self._arrived_after += 1
            if self._takers:
                # A new request can make its bucket full; a linger or deadline running out is the
                # batcher coroutine's to time (it sleeps until the earliest of them).
                if queue.live >= self.max_batch_size:
                    batch = self._take("full", request.enqueued_at, queue)
                    if batch is not None:
                        taker = self._takers.popleft()
                else:
                    wake = queue.live == 1  # the first waiting request of a bucket may start the linger clock
        if taker is not None:
            taker(batch)
        elif wake:
            self._wake.set()

    def withdraw(self, request: PendingRequest, new_state: RequestState) -> bool:
        """Remove a request that is still waiting (client gone, deadline passed). False if it left already."""
        with self._lock:
            removed = self._queues[request.bucket].remove(request, new_state)
            self._depth -= removed
            return removed

    def withdraw_all(self) -> list[PendingRequest]:
        """Remove every waiting request (the model stopped taking work)."""
        with self._lock:
            removed = [r for q in self._queues.values() for r in q.drain()]
            self._depth = 0
            return removed

    def requeue_front(self, requests: list[PendingRequest]) -> None:
        """Put requests of a batch that must run again at the head of the queue."""
        with self._lock:
            for bucket in {r.bucket for r in requests}:
                self._queues[bucket].appendleft([r for r in requests if r.bucket == bucket])
            self._depth += len(requests)
        self._wake.set()

    def stop(self) -> list[PendingRequest]:
        """Release parked workers and return the requests that were still waiting."""
        with self._lock:
            self._stopped = True
            takers, self._takers = list(self._takers), deque()
            leftover = [r for q in self._queues.values() for r in q.drain()]
            self._depth = 0
        for taker in takers:
            taker(None)
        self._wake.set()
        return leftover

    async def run(self) -> None:
        """The batcher coroutine: flushes by linger (or request deadline) for parked workers."""
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            while not self._stopped:
                now = self._clock()
                taker = batch = None
                with self._lock:
                    if not self._takers or not self._depth:
                        break
                    trigger, due_at, due_queue = self._due(now, "linger")
                    if trigger is not None:
                        batch = self._take(trigger, now, due_queue)
                        if batch is not None:
                            taker = self._takers.popleft()
                if trigger is not None:
                    if taker is not None:
                        taker(batch)
                    continue
                # A batch that fills up meanwhile is handed over by `submit`; nothing else makes it due sooner.
                await asyncio.sleep(due_at - now)

    # ---- worker thread side ----------------------------------------------------------------------

    def next_batch(self, finished: int, taker: Taker) -> Batch | None:
        """Called by a free worker that just answered `finished` requests (0: none): the next due batch
        at once, or None after leaving `taker`, which is called with the batch once one is due (or with
        None when the batcher stops; also at once if it has stopped already)."""
        now = self._clock()
        with self._lock:
            stopped = self._stopped
            if not stopped:
                if finished:
                    self._end_cycle(now, finished)
                trigger, _, due_queue = self._due(now, "idle_worker")
                if trigger == "idle_worker" and finished and self.echo_score >= ECHO_SCORE_TO_HOLD:
                    # Stale and partial: the clients of the batch just finished are about to send again.
                    self._hold_until = now + self.max_wait_s
                    self.echo_holds += 1
                    trigger = None
                batch = self._take(trigger, now, due_queue) if trigger is not None else None
                if batch is not None:
                    return batch
                self._takers.append(taker)
                needs_timer = self._depth > 0  # a linger to time for it
        if stopped:
            taker(None)
        elif needs_timer:
            self._loop.call_soon_threadsafe(self._wake.set)
        return None

    # ---- the rule (lock held) --------------------------------------------------------------------

    def _end_cycle(self, now: float, finished: int) -> None:
        """Score the cycle since the previous batch finished, and start the next one."""
        length = now - self._cycle_start
        if self._cycle_start and self._cycle_size and length > 2 * self.max_wait_s > 0:
            rate_in = self._arrived_in_window / self.max_wait_s
            rate_after = self._arrived_after / (length - self.max_wait_s)
            echoed = self._arrived_in_window >= self._cycle_size / 2 and rate_in >= 4 * rate_after
            self.echo_score += _ECHO_ALPHA * (float(echoed) - self.echo_score)
        self._cycle_start, self._cycle_size = now, finished
        self._arrived_in_window = self._arrived_after = 0

    def _due(self, now: float, on_linger: str) -> tuple[str | None, float, RequestQueue | None]:
        """(trigger, when, bucket queue): the trigger if a batch is due now, else None and when it will be."""
        oldest: PendingRequest | None = None
        oldest_queue: RequestQueue | None = None
        for queue in self._queues.values():
            if queue.live >= self.max_batch_size:
                return "full", now, queue
            head = queue.oldest() if queue.live else None
            if head is not None and (oldest is None or head.enqueued_at < oldest.enqueued_at):
                oldest, oldest_queue = head, queue
        if oldest is None:
            return None, float("inf"), None
        linger_end = max(oldest.enqueued_at + self.max_wait_s, self._hold_until)
        if now >= linger_end:
            return on_linger, now, oldest_queue
        # Flush early if lingering on would make the oldest request miss a deadline it can still meet.
        deadline_end = oldest.deadline - self._batch_time_s()
        if deadline_end <= oldest.enqueued_at:
            return None, linger_end, None  # it cannot be met even at once: lingering changes nothing
        if now >= deadline_end:
            return "deadline", now, oldest_queue
        return None, min(linger_end, deadline_end), None

    def _take(self, trigger: str, now: float, queue: RequestQueue | None) -> Batch | None:
        if queue is None:
            return None
        live = queue.live
        requests = queue.take(self.max_batch_size, now)
        self._depth -= live - queue.live  # taken, and any found expired on the way
        if not requests:
            return None  # everything due had expired
        self.flushes[trigger] += 1
        self._hold_until = 0.0
        return Batch(next(self._batch_ids), requests, trigger, now)
