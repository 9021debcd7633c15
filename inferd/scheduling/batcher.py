"""When a batch leaves the queue, and who takes it.

Batches form late: requests leave the queue only when a worker is free to run them, so everything that
arrived while every worker was busy joins the next batch. Three paths hand out batches, all deciding
with the same rule (`policy.decide`) under one lock:

- a worker that finishes a batch asks for the next one itself (`next_batch`), from its own thread; when
  one is due it gets it at once, so under saturation it never waits for the event loop; when none is,
  it leaves a taker (a callable that hands it a batch) and parks;
- `submit` (on the event loop) hands a full batch straight to a parked taker;
- the batcher coroutine (`run`) times the rest for parked takers: it sleeps until the rule says a
  bucket is due (a linger ending, a deadline forcing an early flush, a lone request worth sending),
  or until `submit` wakes it with a request that may make a bucket due sooner: the first of its
  bucket, or one whose due comes before the sleep ends by two of its bucket's batch times (a higher
  tier's tighter objective joining a lower tier's linger: else it waited the linger out, and an
  enterprise request with a 200 ms objective beside free ones lingering for 1 s took up to 600 ms).

The batcher knows takers only as callables: who they are (executor threads) is not its business.

The linger is counted from the oldest waiting request, so a request that already waited while the
workers were busy is not made to wait again (unless closed-loop clients echo the batches: `arrivals`).

Requests carry a bucket key (e.g. a token-length bucket, from the backend's `prepare`); each bucket
has its own queue and a batch never mixes buckets. Which bucket goes, and when, is the scheduling rule
in `policy`; the batcher measures what the rule and the forecast need (arrival rate, queue per tier).

When the queue is full, room is made before anyone is refused by shedding a waiting request of a lower
tier or of a clearly heavier tenant (`shedding`): a light tenant is not refused because a heavy one
filled the queue.

Why one module: everything here changes the queues under one lock shared by the loop and the worker
threads; what the lock guards stays in one place (the rule, the filling and the shedding it applies
are modules of their own, and so are the readings admission and the forecast take of the queues,
`queue_readings`, which change nothing).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from ..messages import Batch, Client, PendingRequest, RequestState, Taker
from .arrivals import CallMix, Echo, Rate
from .batch_costs import BatchCosts
from .policy import BucketView, Decision, Limits, decide
from .queue_readings import QueueReadings
from .request_queue import RequestQueue
from .shedding import choose_victim

SHORT_JUMP_WINDOW, SHORT_JUMPS_MAX = 8, 6  # short calls may jump the oldest (policy's rule 3) in 6 of 8 batches
PROBE_EVERY = 16  # a batch in this many, cut at a size limit, grows past it (`_grow_to`)


class QueueFull(Exception):
    """The model already holds `max_queue` waiting requests."""


class Batcher(QueueReadings):
    """One model's queues (one per length bucket) and the rule that turns them into batches.

    `costs` tells what a batch of each bucket and size costs (deadline flushes, where a batch stops
    growing); `batch_time_s` how long a batch takes on the whole lately (the age gap); `linger_s(bucket)`
    how long a partial batch of that bucket may wait. `clock` is injectable so the rule can be tested
    on a fake clock."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        loop: asyncio.AbstractEventLoop,
        tiers: Iterable[tuple[str, float | None]] = (("default", None),),
        batch_time_s: Callable[[], float] = lambda: 0.0,
        costs: BatchCosts | None = None,
        linger_s: Callable[[int], float] | None = None,
        max_batch_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.flushes: Counter[str] = Counter()  # batches by trigger
        self.shed = 0  # queued requests shed to make room for a higher tier or a lighter tenant
        self._batch_time_s = batch_time_s
        self.costs = costs if costs is not None else BatchCosts(max_batch_size)
        self._linger_s = linger_s if linger_s is not None else (lambda bucket: self.max_wait_s)
        self._clock = clock
        self._loop = loop
        self._lock = threading.Lock()
        self._token_limits = Limits(max_batch_tokens, 0.0)
        self._tiers = list(tiers)
        self._whole_call = max(1, max_batch_size // 4)  # a call of at most this many inputs goes whole in its turn
        self._tier_rank = {name: len(self._tiers) - i for i, (name, _) in enumerate(self._tiers)}
        self._single_tier = len(self._tiers) == 1
        self._one_tenant: str | None = ""  # the only tenant seen so far ("": none yet; None: several)
        self._calls_seen = False  # an input of a multi-input call was ever queued (until then, a tenant's queue is FIFO)
        self._call_mix = CallMix()  # whether short calls come beside large ones
        self._arrivals = Rate()
        self._arrivals_by_rank: dict[int, Rate] | None = None if self._single_tier else {}
        # by tier rank, of the batches it was the highest tier in lately: (their time less what the lower
        # tiers' requests riding in them would have cost in full batches, their time), decaying
        self._time_by_rank: dict[int, tuple[Rate, Rate]] | None = None if self._single_tier else {}
        self._queues: dict[int, RequestQueue] = {0: RequestQueue(self._tiers, self._whole_call)}  # by bucket
        self._depth = 0  # live requests over every bucket
        self._last_batch: dict[int, float] = {}  # by bucket: when its last batch was taken
        self._takers: deque[Taker] = deque()  # parked workers, first parked first served
        self._wake = asyncio.Event()
        self._batch_ids = itertools.count(1)
        self._stopped = False
        self.echo = Echo()  # the closed-loop echo of finished batches, and its holds (under the lock)
        # of the last batches, which went before the oldest for a short call (policy's rule 3)
        self._short_jumps: deque[bool] = deque(maxlen=SHORT_JUMP_WINDOW)
        self._at_limit: dict[int, int] = {}  # by bucket: batches taken at a cut size limit since the last probe
        self.size_probes = 0  # batches grown past a cut size limit (`_grow_to`): `GET /v1/models` shows it

    # ---- event loop side -------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting for a batch (kept as a count: read per request by admission)."""
        return self._depth

    def submit(self, request: PendingRequest) -> PendingRequest | None:
        """Queue a request. When `max_queue` requests already wait, a request of a lower tier or of a
        clearly heavier tenant is shed to make room and returned (the caller answers it); with none,
        raises QueueFull."""
        taker: Taker | None = None
        batch: Batch | None = None
        wake = False
        shed = None
        with self._lock:
            if self._depth >= self.max_queue:
                shed = self._shed_for(request)
                if shed is None:
                    raise QueueFull
            queue = self._queues.get(request.bucket)
            if queue is None:
                queue = self._queues[request.bucket] = RequestQueue(self._tiers, self._whole_call)
            queue.append(request)
            self._depth += 1
            now = request.enqueued_at
            self._arrivals.add(now)
            if self._arrivals_by_rank is not None:
                self._arrivals_by_rank.setdefault(self.tier_rank(request.tier), Rate()).add(now)
            echo = self.echo  # (the clients a free worker is held for, back?)
            echo_back = echo.arrived(now, request.client, self._linger_s(request.bucket) if echo.hold_until else 0.0)
            one = self._one_tenant
            if one is not None and request.tenant != one:  # the first tenant seen, then None for good
                self._one_tenant = request.tenant if one == "" else None
            if request.call_id is not None:
                self._calls_seen = True
            if self._calls_seen:  # (until a call comes, none is large: a single request's path is one test)
                # beside large calls, short ones wait for less: batches stop at the cost model's smallest
                # size with 95% of the best throughput (`BatchCosts.set_short_calls_beside_large`)
                beside = self._call_mix.beside(request.call_id is None or request.call_size <= self._whole_call, now)
                if beside is not self.costs.short_calls_beside_large:
                    self.costs.set_short_calls_beside_large(beside)
            if self._takers:
                # A new request can make its bucket full; a linger or deadline running out, or a lone
                # request worth sending at once, is the batcher coroutine's to decide (it sleeps until
                # the earliest of them), woken by the first request of a bucket.
                full = queue.live >= self.costs.size_limit(request.bucket) or (
                    self.max_batch_tokens is not None and queue.tokens >= self.max_batch_tokens)
                if full or echo_back:
                    decision = self._decision(now, "linger", echo_back)  # (which bucket goes is still the rule's)
                    batch = self._take(decision.trigger, now, decision.bucket, decision.short_jump)
                    if batch is not None:
                        taker = self._takers.popleft()
                else:
                    wake = queue.live == 1 or request.due < queue.wake_before
        if taker is not None:
            taker(batch)
        elif wake:
            self._wake.set()
        return shed

    def _shed_for(self, request: PendingRequest) -> PendingRequest | None:
        """Room for `request` in a full queue (lock held): the waiting request `shedding` picks, taken out.
        None: the newcomer is the one to refuse."""
        picked = choose_victim(request, self._queues, self._tiers, self._tier_rank)
        if picked is None:
            return None
        victim, queue = picked
        queue.remove(victim, RequestState.REJECTED)
        self._depth -= 1
        self.shed += 1
        return victim

    def promote(self, request: PendingRequest, tier: str) -> None:
        """Serve a waiting request at `tier` from now on, if that is higher than its own (an identical
        request of that tier waits on its computation)."""
        if self.tier_rank(tier) <= self.tier_rank(request.tier):
            return
        with self._lock:
            if request.state is RequestState.QUEUED:
                self._queues[request.bucket].promote(request, tier)
        self._wake.set()  # (a bucket may be due sooner at its new rank)

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
        wake, loop = self._wake, asyncio.get_running_loop()
        while not self._stopped:
            await wake.wait()
            wake.clear()
            while not self._stopped:
                now = self._clock()
                due_at = self.dispatch(now)
                if due_at is None:
                    break
                # Until then, unless woken sooner: a batch that fills up meanwhile is handed over by
                # `submit`, which wakes this for a new bucket or a sooner due (see the module docstring).
                timer = loop.call_later(min(1.0, due_at - now), wake.set)
                await wake.wait()
                wake.clear()
                timer.cancel()

    def woken(self) -> bool:
        """Whether something woke the batcher coroutine since this was last asked (and forget it): for
        a caller that runs `dispatch` itself instead of `run` (the fleet simulator's replicas)."""
        if self._wake.is_set():
            self._wake.clear()
            return True
        return False

    def dispatch(self, now: float) -> float | None:
        """Hand every batch due now to a parked worker; then when the next may be due (None: no worker is
        parked, or nothing waits)."""
        while True:
            taker = batch = None
            with self._lock:
                if self._stopped or not self._takers or not self._depth:
                    return None
                decision = self._decision(now, "linger")
                if decision.bucket is None:
                    self._sleeping_until(decision.due_at)
                    return decision.due_at
                batch = self._take(decision.trigger, now, decision.bucket, decision.short_jump)
                if batch is not None:
                    taker = self._takers.popleft()
            if taker is not None:
                taker(batch)

    def _sleeping_until(self, due_at: float) -> None:
        """Nothing is due before `due_at` (lock held): each bucket's request that could make it due sooner
        is one due before then plus two of its batch times (the rule's deadline trigger fires at the
        latest start, `policy.latest_start`, at least that long before a due; a batch at its size limit
        costs the most)."""
        costs = self.costs
        for key, queue in self._queues.items():
            if queue.live:
                queue.wake_before = due_at + 2.0 * costs.safe_estimate(costs.size_limit(key), key)

    # ---- worker thread side ----------------------------------------------------------------------

    def next_batch(self, finished: Sequence[Client | None], taker: Taker | None) -> Batch | None:
        """Called by a free worker that just answered requests on the `finished` connections (None: one not
        known; (): it answered none, `execution.worker.answered_by`): the next due batch
        at once, or None after leaving `taker`, which is called with the batch once one is due (or with
        None when the batcher stops; also at once if it has stopped already). `taker` None: a worker
        with a batch still computing asks for one to launch behind it: a full batch or nothing, and it
        does not park (a partial batch waits to grow until a worker is free for it)."""
        now = self._clock()
        with self._lock:
            stopped = self._stopped
            if not stopped:
                batch_s = self._batch_time_s() if finished else 0.0  # (what a batch takes: the echo's scale)
                if finished:
                    self.echo.batch_finished(now, len(finished), batch_s)
                decision = self._decision(now, "idle_worker")
                trigger = decision.trigger
                if taker is None:
                    return self._take(trigger, now, decision.bucket, decision.short_jump) if trigger == "full" else None
                if trigger in ("idle_worker", "sparse", "") and finished and not decision.short_jump and \
                        self.echo.hold(finished, now, self._depth > 0, batch_s):
                    # Partial, stale or nothing yet: the clients of the batch just finished are about to send
                    # again; their batch goes once they are back, or the first of them lingered (`Echo.hold`;
                    # not when a short call's batch goes first: holding would keep it behind the echo).
                    trigger = ""
                batch = self._take(trigger, now, decision.bucket, decision.short_jump) if trigger else None
                if batch is not None:
                    return batch
                self._takers.append(taker)
                needs_timer = self._depth > 0  # a linger to time for it
        if stopped:
            if taker is not None:
                taker(None)
        elif needs_timer:
            self._loop.call_soon_threadsafe(self._wake.set)
        return None

    # ---- the rule (lock held) --------------------------------------------------------------------

    def _decision(self, now: float, on_linger: str, echo_back: bool = False) -> Decision:
        """The scheduling rule's decision now (see `policy`)."""
        limits = Limits(self.max_batch_tokens, max(2 * self._batch_time_s(), self.max_wait_s))
        views = [self._view(key, q, now) for key, q in self._queues.items() if q.live]
        return decide(views, now, limits, arrival_rate=self._arrivals.per_s(now), hold_until=self.echo.hold_until,
                      on_linger=on_linger, short_jumps=sum(self._short_jumps) < SHORT_JUMPS_MAX, echo_back=echo_back)

    def _view(self, key: int, queue: RequestQueue, now: float) -> BucketView:
        costs = self.costs
        return queue.view(key, now, costs.size_limit(key), partial(costs.safe_estimate, bucket=key), self._linger_s(key))

    def _take(self, trigger: str, now: float, bucket: int | None, short_jump: bool = False) -> Batch | None:
        if bucket is None or (queue := self._queues.get(bucket)) is None:
            return None
        costs = self.costs
        live = queue.live
        # A batch begins with its bucket's oldest short call, wherever that call's turn stands, in at most
        # 6 of the last 8 batches (the rule's budget for short calls going first: `policy`, rule 3)
        short_first = short_jump or (self._calls_seen and sum(self._short_jumps) < SHORT_JUMPS_MAX)
        requests = queue.take(self._grow_to(bucket, live), now, self.max_batch_tokens, costs.curve(bucket), costs.level,
                              1.0 + costs.slack, costs.max_batch_size, short_first=short_first)
        self._depth -= live - queue.live  # taken, and any found expired on the way
        if not requests:
            return None  # everything due had expired
        self.flushes[trigger] += 1
        first = requests[0]
        self._short_jumps.append(short_jump or (short_first and first.call_id is not None and first.call_size <= self._whole_call))
        self.echo.batch_left(now)
        self._last_batch[bucket] = now
        if self._time_by_rank is not None:
            self._note_time(self._time_by_rank, requests, bucket, now)
        return Batch(next(self._batch_ids), requests, trigger, now, backlog=self._depth)

    def _grow_to(self, bucket: int, waiting: int) -> int:
        """Where this batch of `bucket` stops growing: its size limit, except that without an objective,
        where the limit is below `max_batch_size` because larger batches were measured slower, one batch
        in `PROBE_EVERY` that has more waiting than the limit grows to twice it. The sizes above the
        limit then run again now and then, so a measurement that made them look slow (one warm-up call
        on a noisy host) is corrected instead of cutting throughput for good."""
        costs = self.costs
        limit = costs.size_limit(bucket)
        if costs.slo_s is not None or costs.short_calls_beside_large or limit >= costs.max_batch_size or waiting <= limit:
            return limit  # (beside short calls the limit is chosen short, not measured slow: nothing to probe)
        taken = self._at_limit[bucket] = self._at_limit.get(bucket, 0) + 1
        if taken < PROBE_EVERY:
            return limit
        self._at_limit[bucket] = 0
        self.size_probes += 1
        return min(costs.max_batch_size, 2 * limit)

    def _note_time(self, time_by_rank: dict[int, tuple[Rate, Rate]], requests: list[PendingRequest], bucket: int,
                   now: float) -> None:
        """A batch's expected time, noted for its highest tier, and how much of it that tier took from the
        tiers below: all of it, less what their requests riding in it would have cost in a full batch
        of their own (at least its own slots' part). `queue_readings.time_taken` reads the two."""
        costs = self.costs
        estimate = costs.estimate(len(requests), bucket)
        if not estimate:
            return
        ranks = Counter(self.tier_rank(r.tier) for r in requests)
        top = max(ranks)
        own = ranks[top]
        riders_s = (len(requests) - own) * costs.full_batch_s(bucket) / costs.size_limit(bucket)
        taken, total = time_by_rank.get(top) or time_by_rank.setdefault(top, (Rate(), Rate()))
        taken.add(now, max(estimate * own / len(requests), estimate - riders_s))
        total.add(now, estimate)
