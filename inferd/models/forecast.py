"""What a model's load predicts: how long a request queued now waits for its batch and how long that
batch takes, the requests per second the model can serve, and the share of its time each tier takes.

Pure arithmetic on what it is told: the batches it observes (their time, size and length bucket, the
tier they served), and at each question the queue ahead of the request by bucket, the healthy workers
and how soon one is free. Batch times come from the measured cost model (`scheduling.batch_costs`), so
a queue of short inputs and one of long inputs predict different waits. Reading never changes it; the
capacity reference that rate limits scale against moves only when `note_capacity` is called.

A predicted wait counts what will really be ahead: every bucket's waiting requests in batches as large
as that bucket's batches go (partial batches of another bucket take a whole call too), each costed by
the cost model, spread over the healthy workers; and the share of the workers' time that higher tiers
have been taking, since their requests arriving meanwhile go first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from ..scheduling.batch_costs import BatchCosts

EWMA_ALPHA = 0.2
MAX_SHARE = 0.95  # past this share of time taken by higher tiers, a lower tier's wait is endless


class Forecast:
    """Estimates for one batch model version, on its cost model."""

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.max_batch_size = costs.max_batch_size
        self.batch_s = 0.0  # exponentially weighted mean of the backend call time, whatever its shape; 0: none yet
        self.loaded_batch = float(costs.max_batch_size)  # mean size of batches taken while more waited
        self.peak_capacity_rps = 0.0  # the best capacity noted: what rate limits are scaled against
        self.gaps_s: deque[float] = deque(maxlen=2048)  # a worker's turnarounds between back-to-back calls
        self._lingers: dict[tuple[int, float], tuple[int, float]] = {}  # (bucket, slo_ms) -> (costs' revision, linger)

    def observe_batch(self, seconds: float, size: int = 0, bucket: int = 0, backlog: int = 0,
                      gap_s: float | None = None, at: float = 0.0) -> None:
        """A backend call of `size` requests of length bucket `bucket` took `seconds` (the first one, e.g.
        a warm-up call, sets the mean), taken while `backlog` more waited, ending at `at`; `gap_s`: it ran
        back to back with its worker's previous call, this long after it. The cost model
        learns the call with that turnaround (a queued batch costs the worker both), so what the loop
        or a collector pause takes from the workers is in every predicted wait."""
        self.batch_s = seconds if not self.batch_s else self.batch_s + EWMA_ALPHA * (seconds - self.batch_s)
        if gap_s is not None:
            self.gaps_s.append(gap_s)
        if not size:
            return
        self.costs.observe(bucket, size, seconds + (gap_s or 0.0), at)
        if backlog > 0:
            self.loaded_batch += EWMA_ALPHA * (size - self.loaded_batch)

    def gap_p50_ms(self) -> float | None:
        """The median turnaround between back-to-back calls: how long a saturated worker idles between
        batches (on the loop: the workers hand their figures over with their batches)."""
        gaps = sorted(self.gaps_s)
        return round(gaps[len(gaps) // 2] * 1000, 3) if gaps else None

    # ---- capacity --------------------------------------------------------------------------------

    def capacity_rps(self, healthy: int) -> float:
        """Requests/s `healthy` workers sustain: batches as large as the load has let them be, at the mean
        batch time."""
        return healthy * self.loaded_batch / self.batch_s if self.batch_s else 0.0

    def share_of(self, rate: float, healthy: int, fill_s: float | None = None) -> float:
        """Of `healthy` workers' time, what `rate` requests/s take: in batches as large as the load lets
        them be, or, with `fill_s` (a tier whose own objective cuts its batches: `policy`), in the batch
        that rate fills in that time (a higher tier with 200 ms to be answered in, at 50 ms a batch,
        takes a batch every ~100 ms however few it sends meanwhile)."""
        if not self.batch_s:
            return 0.0
        size = self.loaded_batch if fill_s is None else min(self.loaded_batch, max(1.0, rate * fill_s))
        return rate * self.batch_s / (healthy * size)

    def note_capacity(self, healthy: int) -> None:
        self.peak_capacity_rps = max(self.peak_capacity_rps, self.capacity_rps(healthy))

    def capacity_scale(self, healthy: int) -> float:
        """Capacity now as a share of the best noted: what rate limits are multiplied by."""
        return self.capacity_rps(healthy) / self.peak_capacity_rps if self.peak_capacity_rps else 1.0

    # ---- waits -----------------------------------------------------------------------------------

    def linger_s(self, max_wait_ms: float, slo_ms: float | None, bucket: int = 0) -> float:
        """How long a partial batch of `bucket` may wait for more: `max_wait_ms`, or with a latency
        objective what it leaves after a batch in progress and the request's own batch (slo - 2 batch
        times, each that bucket's useful batch as the cost model predicts it, with its slack)."""
        if slo_ms is None:
            return max_wait_ms / 1000.0
        costs = self.costs
        made = self._lingers.get((bucket, slo_ms))  # (asked per decision and per request: made once a revision)
        if made is not None and made[0] == costs.revision:
            return made[1]
        estimate = costs.estimate(costs.size_limit(bucket), bucket)
        batch_s = (estimate or self.batch_s) * (1.0 + costs.slack)
        linger = max(0.0, slo_ms / 1000.0 - 2 * batch_s)
        if estimate:  # (else it reads the mean batch time, which moves without a revision)
            self._lingers[(bucket, slo_ms)] = (costs.revision, linger)
        return linger

    def wait_s(self, ahead: Mapping[int, int], bucket: int | None, healthy: int, first_free_s: float,
               share_above: float = 0.0, sigmas: float = 0.0) -> float:
        """How long a request of `bucket` would wait for its batch to start, with `ahead[b]` requests of
        bucket b before it: until a worker is free, then the batches ahead of it, spread over the
        workers. Its own bucket's partial batch is its own (it joins it); another bucket's is a whole
        call (`bucket` None: every partial batch is). `share_above` of the workers' time going to
        higher tiers leaves 1 - share_above of each batch for these; `sigmas`: count that many standard
        deviations more of the higher tiers' arrivals (a Poisson count), for a wait that holds at the
        tail rather than on average (what a burst of higher-tier work does to a lower tier)."""
        return self.waits_s(ahead, bucket, healthy, first_free_s, share_above, sigmas, False)[0]

    def waits_s(self, ahead: Mapping[int, int], bucket: int | None, healthy: int, first_free_s: float,
                share_above: float, sigmas: float, alone: bool) -> tuple[float, float]:
        """`wait_s`, and with `alone` beside it the wait were its bucket's partial batch a whole call too
        (what `bucket` None reads: admission asks both of one queue, `Timeliness.refusal`; nan without
        `alone`). One pass, each sum added in the order of its own call's, so either is the same number."""
        if healthy == 0:
            wait = math.inf if any(ahead.values()) else 0.0
            return wait, wait
        room = 1.0 - share_above  # of each batch, what is left for this work (the rest: higher tiers arriving)
        if room <= 1.0 - MAX_SHARE:
            return math.inf, math.inf
        costs, spread = self.costs, share_above and sigmas  # (no spread: count / slots, without the call)
        work = every = 0.0  # `every`: with its own bucket's partial batch (`alone`)
        for b, count in ahead.items():
            if count:
                size = costs.size_limit(b)
                slots = size * room
                full = int(_batches_to_serve(count, slots, size * share_above * sigmas * sigmas) if spread else count / slots)
                if full:
                    cost = full * (costs.full_batch_s(b) or self.batch_s)
                    work += cost
                    every += cost
                if count > full * slots and (b != bucket or alone):  # (a partial batch of at least one)
                    cost = self.batch_cost_s(round(count - full * slots) or 1, b)
                    every += cost
                    if b != bucket:
                        work += cost
        return first_free_s + work / healthy, first_free_s + every / healthy if alone else math.nan

    def own_batch_s(self, ahead_in_bucket: int, bucket: int, joining: float = 0.0) -> float:
        """How long the request's own batch takes: it holds what is ahead of it in its bucket's partial
        batch, itself, and up to `joining` requests expected to arrive before it is taken (no more than
        the largest batch of the bucket measured so far)."""
        size = self.costs.size_limit(bucket)
        holds = ahead_in_bucket % size + 1
        # Joiners beyond the largest batch this bucket has run are not counted: an arrival rate read in a
        # burst (8 closed-loop clients echoing a 3 s batch) once priced 14-input batches that could never
        # form, refusing requests with 10 s to spare. Larger batches, when they come, are learned as they run.
        if joining >= 1.0:  # (max(holds, min(holds + int(joining), largest or size)) without the calls)
            largest = self.costs.largest_measured(bucket) or size
            if holds < largest:
                holds = min(holds + int(joining), largest)
        return (self.costs.full_batch_s(bucket) or self.batch_s) if holds >= size else self.batch_cost_s(holds, bucket)

    def batch_cost_s(self, size: int, bucket: int) -> float:
        """A batch's time as the cost model has it, or the mean batch time while it has nothing."""
        return self.costs.estimate(size, bucket) or self.batch_s

    def settled_batch_cost_s(self, size: int, bucket: int) -> float | None:
        """`batch_cost_s` of a batch just done (not learned from yet), against which its answers' lateness
        is measured (`Lateness`); None while its shape is still learned, as the margin's errors leave it
        out: on a host slowed fourfold since its warm-up, the first batches ran 30x their estimates, and
        that onset held the bound at 3 s for the next 30 s, above every later answer's lateness (0.6-1.8 s)."""
        return None if self.costs.learning(size, bucket) else self.batch_cost_s(size, bucket)


def _batches_to_serve(count: int, slots: float, spread: float) -> float:
    """How many batches pass before `count` requests are served, `slots` of each batch being theirs on
    average, when the higher tiers' arrivals over t batches may exceed their mean by sqrt(spread x t)
    (`spread`: sigmas squared times their mean per batch): t solves slots t - sqrt(spread t) = count."""
    if not spread:
        return count / slots
    root = (math.sqrt(spread) + math.sqrt(spread + 4.0 * slots * count)) / (2.0 * slots)
    return root * root
