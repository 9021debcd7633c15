"""What admission, the forecast and the reports read of a batcher's queues: how many wait, and behind
whom a new request would wait, per bucket and tier; when a bucket's next batch should start; how long
a request queued now would linger; how fast requests arrive. A part of `Batcher` (its base class):
readings only, taken under the batcher's lock where they read more than one number, changing nothing.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable

from ..messages import PendingRequest
from .arrivals import Echo, Rate
from .batch_costs import BatchCosts
from .batch_filling import tokens_of
from .policy import BucketView, Limits, due_in
from .request_queue import RequestQueue


class QueueReadings:
    """The batcher's readings (see the module docstring); the state they read is the batcher's."""

    costs: BatchCosts
    _lock: threading.Lock
    _queues: dict[int, RequestQueue]
    _single_tier: bool
    _one_tenant: str | None
    _calls_seen: bool
    _last_batch: dict[int, float]
    _arrivals: Rate
    _arrivals_by_rank: dict[int, Rate] | None
    _time_by_rank: dict[int, tuple[Rate, Rate]] | None
    _tier_rank: dict[str, int]
    _token_limits: Limits
    _linger_s: Callable[[int], float]
    echo: Echo

    def depth_by_tier(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for q in self._queues.values():
            totals.update(q.live_by_tier())
        return dict(totals)

    def ahead_by_bucket(self, tier: str | None, tenant: str | None = None, call_id: str | None = None) -> dict[int, int]:
        """Requests a new request of `tier` (from `tenant`; an input of call `call_id`, if one of a multi-input
        call's) would wait behind, per length bucket (see `RequestQueue.live_ahead_of`; `tier` None:
        everything waiting). One tier and one tenant without multi-input calls: all of it, in order, read
        without the lock (counts only); otherwise under it: a worker's thread taking a batch changes the
        tenants' counts and the calls it walks (read bare, a mixed soak got 500s for "dictionary changed
        size during iteration")."""
        if tier is None or (self._single_tier and (tenant is None or (self._one_tenant is not None and not self._calls_seen))):
            ahead = {}
            for key, q in self._queues.items():  # (asked per request: a loop costs less than a comprehension)
                ahead[key] = q.live
            return ahead
        with self._lock:  # (the turns and calls it walks change under a worker taking a batch)
            if self._single_tier and (tenant is None or self._one_tenant is not None):
                return {key: q.live if not q.has_calls() else q.live_ahead_of(tier, tenant, call_id)
                        for key, q in self._queues.items()}
            return {key: q.live_ahead_of(tier, tenant, call_id) for key, q in self._queues.items()}

    def next_start(self, bucket: int) -> float | None:
        """When the next batch of `bucket` was predicted to start: its oldest waiting request's predicted
        start (None: none waits, or nothing was predicted for it)."""
        with self._lock:
            queue = self._queues.get(bucket)
            head = queue.oldest() if queue is not None and queue.live else None
        return None if head is None or head.predicted_wait is None else head.enqueued_at + head.predicted_wait

    def busy_besides(self, bucket: int, now: float, within_s: float) -> bool:
        """Whether a bucket other than `bucket` has requests waiting or took a batch within `within_s`:
        one whose requests come now (admission judges the buckets alike then, under an objective:
        `timeliness`)."""
        last_batch = self._last_batch
        for key, queue in self._queues.items():
            if key != bucket and (queue.live or now - last_batch.get(key, -math.inf) <= within_s):
                return True
        return False

    def linger_left(self, request: PendingRequest, now: float) -> float:
        """How long `request`, queued now into its bucket with a worker free, would wait for its batch to
        be due: the rest of the bucket's linger, cut short as the rule cuts it (full, sparse, deadline)."""
        bucket, costs = request.bucket, self.costs
        with self._lock:  # (asked per request while a worker is free: only what the rule reads of the queue)
            queue = self._queues.get(bucket)
            count, tokens = (queue.live, queue.tokens) if queue is not None else (0, 0)
            oldest_at, due = queue.oldest_and_due() if queue is not None and count else (now, request.due)
            rate, hold_until = self._arrivals.per_s(now), self.echo.hold_until
        count += 1
        view = BucketView(bucket, count, tokens + tokens_of(request), min(oldest_at, now), min(due, request.due), 0.0, now,
                          costs.size_limit(bucket), costs.safe_estimate(count, bucket), self._linger_s(bucket))
        return due_in(view, now, self._token_limits, arrival_rate=rate, hold_until=hold_until)

    def arrival_rate(self, now: float) -> float:
        """Requests per second arriving lately (all tiers)."""
        return self._arrivals.per_s(now)

    def arrival_rates_above(self, tier: str, now: float) -> list[tuple[int, float]]:
        """(rank, requests per second arriving lately) of each tier above `tier` (none with one tier)."""
        rank = self.tier_rank(tier)
        return [(k, r.per_s(now)) for k, r in (self._arrivals_by_rank or {}).items() if k > rank]

    def time_taken(self, rank: int, now: float) -> tuple[float, float]:
        """What the batches a tier was the highest in took lately from the tiers below it (their time less
        what those tiers' requests riding in them would have cost in full batches of their own): seconds
        per second, and as a share of the batches' time (0.0 and 1.0: no such batch lately)."""
        rates = (self._time_by_rank or {}).get(rank)
        if rates is None:
            return 0.0, 1.0
        seconds, of = rates[0].per_s(now), rates[1].per_s(now)
        return seconds, min(1.0, seconds / of) if of > 0 else 1.0

    def tier_rank(self, tier: str) -> int:
        """A tier's place: higher goes first."""
        return self._tier_rank.get(tier, 0)

    def oldest_age_by_tier(self, now: float) -> dict[str, float]:
        ages: dict[str, float] = {}
        with self._lock:
            for q in self._queues.values():
                for tier, age in q.oldest_age_by_tier(now).items():
                    ages[tier] = max(age, ages.get(tier, 0.0))
        return ages
