"""What a model's load predicts: the time a batch takes, the requests per second it can serve, and how
long a request queued now would wait.

Pure arithmetic on what it is told: the batches it observes (their time, their size when more was
waiting, the tier they served), and at each question the queue ahead, the healthy workers and how
soon one is free. Reading never changes it; the capacity reference that rate limits scale against
moves only when `note_capacity` is called (a worker ready or a batch done).

A predicted wait counts what will really be ahead: batches as large as the load has let them be lately
(partial batches of a second length bucket take a whole call too), and the share of the workers' time
that higher tiers have been taking, since their requests arriving meanwhile go first.
"""

from __future__ import annotations

import math

from ..scheduling.arrivals import Rate

EWMA_ALPHA = 0.2
MAX_SHARE = 0.95  # past this share of time taken by higher tiers, a lower tier's wait is endless


class LoadModel:
    """Estimates for one batch model with `max_batch_size` requests per batch."""

    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.batch_s = 0.0  # exponentially weighted mean of the backend call time; 0: not measured yet
        self.loaded_batch = float(max_batch_size)  # mean size of batches taken while more waited
        self.peak_capacity_rps = 0.0  # the best capacity noted: what rate limits are scaled against
        self._busy_by_rank: dict[int, Rate] = {}  # seconds of backend calls per second, by the tier served

    def linger_s(self, max_wait_ms: float, slo_ms: float | None) -> float:
        """How long a partial batch may wait for more: `max_wait_ms`, or with a latency objective, what it
        leaves after a batch in progress and the request's own batch (slo - 2 batch times)."""
        if slo_ms is None:
            return max_wait_ms / 1000.0
        return max(0.0, slo_ms / 1000.0 - 2 * self.batch_s)

    def observe_batch(self, seconds: float, size: int = 0, backlog: int = 0,
                      by_rank: dict[int, int] | None = None, now: float = 0.0) -> None:
        """A backend call of `size` requests took `seconds` (the first one, e.g. a warm-up call, sets the
        estimate), taken while `backlog` more waited; `by_rank`: its requests per tier, whose shares of
        the call's time are what each tier took (None: tiers are not tracked)."""
        self.batch_s = seconds if not self.batch_s else self.batch_s + EWMA_ALPHA * (seconds - self.batch_s)
        if backlog > 0 and size:
            self.loaded_batch += EWMA_ALPHA * (size - self.loaded_batch)
        for rank, count in (by_rank or {}).items():
            busy = self._busy_by_rank.get(rank)
            if busy is None:
                busy = self._busy_by_rank[rank] = Rate()
            busy.add(now, seconds * count / size)

    def share_above(self, rank: int, healthy: int, now: float) -> float:
        """The share of the workers' time that tiers above `rank` have been taking lately."""
        busy = sum(r.per_s(now) for k, r in self._busy_by_rank.items() if k > rank)
        return busy / healthy if healthy else 0.0

    def capacity_rps(self, healthy: int) -> float:
        """Requests/s `healthy` workers sustain: full batches at the estimated batch time."""
        return healthy * self.max_batch_size / self.batch_s if self.batch_s else 0.0

    def note_capacity(self, healthy: int) -> None:
        self.peak_capacity_rps = max(self.peak_capacity_rps, self.capacity_rps(healthy))

    def capacity_scale(self, healthy: int) -> float:
        """Capacity now as a share of the best noted: what rate limits are multiplied by."""
        return self.capacity_rps(healthy) / self.peak_capacity_rps if self.peak_capacity_rps else 1.0

    def predicted_wait_s(self, ahead: int, healthy: int, first_free_s: float, share_above: float = 0.0) -> float:
        """How long a request with `ahead` requests before it would wait for its batch to start: until a
        worker is free, then one batch time per round of the requests ahead. A round holds as many as
        the load has let batches hold lately, less the share of it the higher tiers take (their
        requests arriving meanwhile go first): `share_above` of the time leaves 1 - share_above."""
        if healthy == 0 or not self.batch_s:
            return math.inf if ahead else 0.0
        if share_above >= MAX_SHARE:
            return math.inf
        per_round = self.loaded_batch * healthy * (1.0 - share_above)
        return first_free_s + int(ahead / per_round) * self.batch_s
