"""Whether a request queued now would be answered in time, and how right that prediction turns out.

The question a batch model asks before it queues a request (`refusal`): its predicted wait (the work
ahead of it, by length bucket and tier, each batch costed by the cost model: `forecast`) plus its own
batch, plus a margin calibrated on how far recent batches ran from their estimates
(`scheduling.prediction_errors`), must end by its due: its deadline, or sooner the latency objective
of its model or tier (`slo_ms`, the tighter of the two). Otherwise it is refused at once with a 503,
never queued to miss; the refusal says the figures it compared (the message, and Server-Timing's
`predicted`, `margin` and `budget`). Under an objective, where other length buckets are busy, a
request joining its bucket's partial batch is judged as if its batch were its own, after all that
waits, as one of a bucket with nothing waiting is (else a minority bucket was refused 2-3 times as
often as the majority). A model with nothing to do admits a request that fits without the margin,
and, once it has refused many, one a second whatever its prediction: the batch it makes is
how its estimates learn that they were wrong. A tier's `max_predicted_wait_ms` refuses a lower tier while a higher one still
gets in. Each admitted request that was asked carries its predicted wait (most of those surely in time
are not asked: `asks`); delivery reports the actual one, and the difference is kept per tier
(`wait_error`), so an operator can tell a wrong prediction from a slow model from time spent lingering
for a batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .. import errors
from ..config import ModelConfig, TierConfig
from ..errors import ServiceOverloaded
from ..execution.pool import WorkerPool
from ..messages import Batch, PendingRequest
from ..observability.histogram import WAIT_ERROR_BUCKETS_S, Histogram
from ..scheduling.batcher import Batcher
from ..scheduling.policy import latest_start
from ..scheduling.prediction_errors import MIN_EXCESS
from .forecast import Forecast
from .lateness import Lateness

TAIL_SIGMAS = 2.3  # a lower tier is admitted on the wait that holds unless the higher ones send a 1-in-100 burst
EXACT_S = 0.001  # a linger the rule ends just in time for the request's own batch ends at its due exactly
ASKED_ANYWAY = 16  # of the requests the bound admits, one in this many is asked all the same: predictions stay measured
PROBE_EVERY_S = 1.0  # a model with nothing to do, refusing all it is sent, admits one request this often (`_probe`)
PROBE_AFTER_REFUSALS = 10  # ...once it has refused more than this many since the last
BUSY_WINDOW_S = 1.0  # a bucket that ran a batch within this (or twice the objective) has requests coming


class Timeliness:
    """One batch model version's admission question and its prediction errors."""

    def __init__(self, config: ModelConfig, tiers: Sequence[TierConfig], forecast: Forecast, batcher: Batcher,
                 pool: WorkerPool) -> None:
        self.forecast = forecast
        self.costs = forecast.costs
        self._batcher = batcher
        self._pool = pool
        self._tiered = len(tiers) > 1
        self._workers = config.workers
        self._refuses_early = config.refuse_early  # false: deadlines only (a request predicted late is queued all the same)
        # the longest a partial batch lingers: max_wait_ms, or with an objective less than the objective
        self._linger_bound_s = (config.max_wait_ms if config.slo_ms is None else config.slo_ms) / 1000.0
        self._slo_s = {t.name: _tighter(config.slo_ms, t.slo_ms) for t in tiers}
        self._objective_tiers = frozenset(name for name, slo in self._slo_s.items() if slo is not None)
        # by rank, the tiers with an objective of their own tighter than the model's (their batches are cut)
        self._own_slo_by_rank = {batcher.tier_rank(t.name): t.slo_ms / 1000.0 for t in tiers
                                 if t.slo_ms is not None and (config.slo_ms is None or t.slo_ms < config.slo_ms)}
        # a bucket that ran a batch this lately still has requests coming (`_as_its_own_batch`)
        self._busy_window_s = max(BUSY_WINDOW_S, 2 * max((s for s in self._slo_s.values() if s), default=0.0))
        self._wait_limit_s = {t.name: t.max_predicted_wait_ms / 1000.0 for t in tiers if t.max_predicted_wait_ms}
        self._promote_after_s = {t.name: t.promote_after_ms / 1000.0 for t in tiers if t.promote_after_ms}
        self.wait_error: dict[str, Histogram] = {}  # by tier: actual - predicted wait (seconds)
        self._unasked = 0  # requests the bound admitted since one was asked all the same
        self._probed_at = -math.inf  # when a request the prediction refused last went in as a probe
        self._refused_since_probe = 0
        self.lateness = Lateness()  # how late recent answers came: what bounds the margin
        self._bound_revision = -1  # the cost model's revision the bound's terms were made at
        self._bound_terms = (0.0, 0.0)  # the bound with nothing waiting, and what each waiting request adds
        # With tiers, or under the model's objective (its linger bound is the objective itself), the bound
        # never holds: `surely_in_time` says so at once.
        self._never_sure = self._tiered or config.slo_ms is not None

    def slo_s(self, tier: str) -> float | None:
        """A request's latency objective (seconds from admission), if its model or tier sets one."""
        return self._slo_s.get(tier)

    def refusal(self, request: PendingRequest, now: float, bucket: int | None) -> ServiceOverloaded | None:
        """Why `request` must be refused rather than queued now, if it must (see the module docstring).
        Notes the predicted wait on it. `bucket` None: not prepared yet, so only what is surely ahead
        counts and its own batch is left out (a refusal is then certain; the exact check follows once
        it is prepared)."""
        tier, tiered = request.tier, self._tiered
        # Under an objective, also the wait as a batch of its own (`_as_its_own_batch`), from the same pass:
        # with tiers, the tail's (below), as that judgement reads it.
        as_own = tier in self._objective_tiers and bucket is not None
        wait, alone, ahead = self._waits(tier, now, request.tenant, bucket, 0.0, as_own and not tiered, request)
        lingering = 0.0  # a worker is free: its batch goes when the rule says it is due, never past its due
        if wait == 0.0 and bucket is not None:
            wait = lingering = self._batcher.linger_left(request, now)
        request.predicted_wait = wait
        if tiered:  # for the decision, the wait that holds if the higher tiers send a burst meanwhile
            tail, alone, _ = self._waits(tier, now, request.tenant, bucket, TAIL_SIGMAS, as_own, request)
            wait = max(wait, tail)
        costs = self.costs
        own = 0.0
        judged = wait  # the wait the decision reads: the predicted one, unless `_as_its_own_batch` says more
        if bucket is not None:
            here, size = ahead.get(bucket, 0), costs.size_limit(bucket)
            joining = 0.0  # requests expected to join its batch before it is taken (none: it is full already)
            if (here + 1) % size and 0.0 < wait < math.inf:
                joining = self._batcher.arrival_rate(now) * wait
            own = self.forecast.own_batch_s(here, bucket, joining)
            if as_own and here % size:
                judged = self._as_its_own_batch(now, bucket, wait, alone)
        costs.refresh_margins(now)
        predicted = judged + own  # from now to its answer (the lingering part is the rule's own, exact)
        work = predicted - lingering
        margin = (costs.margin_s(work, self._largest_batch_s(ahead, own), tier not in self._objective_tiers)
                  if work < math.inf else 0.0)
        if margin > MIN_EXCESS * work and self.lateness:  # never more than recent answers were late, at least the floor
            margin = max(MIN_EXCESS * work, min(margin, self.lateness.bound_s(now)))
        request.predicted_start, request.predicted_done = now + wait, now + wait + own
        if not self._refuses_early or now + predicted + margin <= request.due + EXACT_S or self._probe(
                now, now + predicted <= request.due + EXACT_S, exact=bucket is not None):
            limit = self._wait_limit_s.get(tier)
            if limit is None or wait <= limit:
                return None
            return ServiceOverloaded(f"predicted wait {wait * 1000:.0f} ms is over the {tier} tier's {limit * 1000:.0f} ms",
                                     retry_after_ms=errors.retry_after_ms(wait), reason="tier_predicted_wait")
        late_for_deadline = now + predicted + margin > request.deadline + EXACT_S
        which = "deadline" if late_for_deadline else "latency objective"
        budget_ms = ((request.deadline if late_for_deadline else request.due) - now) * 1000
        alike = " as a batch of its own after all that waits (every length bucket alike)" if judged > wait else ""
        refused = ServiceOverloaded(
            f"predicted{alike} {predicted * 1000:.0f} ms (wait {judged * 1000:.0f} ms, compute {own * 1000:.0f} ms) plus a "
            f"{margin * 1000:.0f} ms margin exceeds this request's {budget_ms:.0f} ms {which}",
            retry_after_ms=errors.retry_after_ms(wait), reason="deadline_infeasible" if late_for_deadline else "slo_infeasible")
        refused.server_timing = (f"predicted;dur={predicted * 1000:.3f}, margin;dur={margin * 1000:.3f}, "
                                 f"budget;dur={budget_ms:.3f}")
        return refused

    def _largest_batch_s(self, ahead: dict[int, int], own: float) -> float:
        """The longest single batch a prediction is made of, for its margin (errors of n batches add up
        as sqrt(n)): its own, each bucket's ahead of it (a full one, or the partial one), those running.
        With tiers the costliest of any bucket: higher tiers' arrivals may bring any. (The costliest for
        all once made the margin of two 3 s batches grow linearly, on 32-input batches priced at 15 s that
        never formed: it refused requests predicted at 6.5 s of a 10 s deadline they would have met.)"""
        costs = self.costs
        if self._tiered:
            return max(own, costs.costliest_batch_s())
        largest = own
        for b, count in ahead.items():
            if count:
                size = costs.size_limit(b)
                largest = max(largest, costs.full_batch_s(b) if count >= size else costs.estimate(count, b))
        for batch in self._pool.running():
            largest = max(largest, self._running_s(batch))
        return largest

    def _as_its_own_batch(self, now: float, bucket: int, wait: float, alone: float) -> float:
        """The wait of a request joining its bucket's partial batch, judged as if its batch were its own,
        after every waiting request of every bucket (that partial batch included: `alone`), where other
        buckets are busy. Why: a request of a bucket with nothing waiting pays a batch of its own, and
        one joining a partial batch may go ahead of work that arrived before it; judged by its prediction
        alone, the minority bucket of S10 (a tenth of the load) was refused 37% against the majority's
        20% at 120% of capacity with an objective, 86% against 57% at 200%. Judged alike, both face the
        work waiting plus one batch."""
        return max(wait, alone) if self._batcher.busy_besides(bucket, now, self._busy_window_s) else wait

    def _probe(self, now: float, fits_without_margin: bool, exact: bool) -> bool:
        """Whether a request the prediction refuses goes in all the same, as a probe: only while nothing
        waits or runs, and then one that fits without the margin, or, once the model has refused more
        than `PROBE_AFTER_REFUSALS` since, one in every `PROBE_EVERY_S` whatever its prediction (a lone
        hopeless request is refused, not computed to miss). The batch it makes tells the model whether its estimates were wrong: a
        model that refused everything on a figure only new batches correct stayed locked (once for
        good: a level raised by a busy spell, a size's cell set by one slow batch)."""
        if self._batcher.depth or self._pool.running():
            return False
        if not exact:
            return True  # (not prepared yet: the exact question, once it is, decides)
        self._refused_since_probe += 1
        if fits_without_margin or (now - self._probed_at >= PROBE_EVERY_S
                                   and self._refused_since_probe > PROBE_AFTER_REFUSALS):
            self._probed_at, self._refused_since_probe = now, 0
            return True
        return False

    def asks(self, request: PendingRequest, now: float) -> bool:
        """Whether a prepared request is asked `refusal` (the exact question): wherever the bound below
        does not hold, and one in `ASKED_ANYWAY` of the others, so that predicted waits and their errors
        stay measured at light load too (Server-Timing's `predicted_queue`, `wait_error`)."""
        if self._never_sure or not self.surely_in_time(request, now):
            return True
        self._unasked += 1
        if self._unasked < ASKED_ANYWAY:
            return False
        self._unasked = 0
        return True

    def surely_in_time(self, request: PendingRequest, now: float) -> bool:
        """A bound: were every waiting request a costliest batch of its own, one after another behind the
        running ones on one worker, and its own batch to linger the longest, would it still be answered
        by its due (and within its tier's wait limit)? Then `refusal` cannot refuse it, and is not asked.

        Why: the exact question costs ~8 us a request (a third of a batch model's own work per request,
        measured); this one costs a tenth of that. It holds for a model without a latency objective far
        from its deadlines (S2 at any load: 1 s of work ahead against 10 s deadlines); with an objective
        (the linger alone can take all of it) or with tiers (a higher tier's burst may join the work
        ahead meanwhile) it never holds, and every request is asked exactly. A request it admits and
        `asks` does not pick has no predicted wait (no `predicted_queue` in its Server-Timing, no
        wait-error observation): there was nothing to decide.

        The bound is linear in the requests waiting: its two terms are made again only when the cost
        model changes (once a batch), so that per request it is one multiplication: three calls fewer, one
        of them a property (~330 and ~640 instructions each under callgrind, of ~216,000 per S2 request)."""
        if self._never_sure:
            return False
        costs = self.costs
        if self._bound_revision != costs.revision:
            self._bound_revision = costs.revision
            costliest = costs.costliest_batch_s()
            per_batch = costliest * (1.0 + costs.slack)  # (a margin is at most this share of what it covers)
            fixed = self._linger_bound_s + per_batch * (self._workers + 1) if costliest else 0.0
            self._bound_terms = (fixed, per_batch)
        fixed, per_waiting = self._bound_terms
        if not fixed:
            return False  # nothing measured yet: ask
        bound = fixed + per_waiting * self._batcher.depth
        limit = self._wait_limit_s.get(request.tier) if self._wait_limit_s else None
        return now + bound <= request.due and (limit is None or bound <= limit)

    def wait_and_ahead(self, tier: str | None, now: float, tenant: str | None = None, bucket: int | None = None,
                       sigmas: float = 0.0) -> tuple[float, dict[int, int]]:
        """The predicted wait of a request of `tier` (None: behind everything) from `tenant` in `bucket`
        (None: unknown) queued now, counting the higher tiers' work expected to arrive meanwhile (and
        `sigmas` standard deviations more of it); and what is ahead of it, by bucket."""
        wait, _, ahead = self._waits(tier, now, tenant, bucket, sigmas, False, None)
        return wait, ahead

    def _waits(self, tier: str | None, now: float, tenant: str | None, bucket: int | None, sigmas: float,
               alone: bool, asking: PendingRequest | None) -> tuple[float, float, dict[int, int]]:
        """`wait_and_ahead`, and with `alone` beside the wait the one `bucket` None reads of the same queue
        (its bucket's partial batch a whole call too: `_as_its_own_batch`; nan without `alone`). `asking`:
        the request it is for, where one is: the multi-input call it is an input of (its tenant's calls
        take turns in the queue), and its due, which can make its bucket's partial batch go sooner than
        that batch's oldest request was predicted to."""
        batcher, forecast, pool = self._batcher, self.forecast, self._pool
        due = asking.due if asking is not None else None
        ahead = batcher.ahead_by_bucket(tier, tenant, asking.call_id if asking is not None else None)
        healthy, first_free_s = pool.healthy, pool.first_free_s(now, self._running_s)
        share = 0.0  # of each batch, what the higher tiers' requests arriving meanwhile take
        if self._tiered and tier is not None and healthy:
            for rank, rate in batcher.arrival_rates_above(tier, now):
                slo_s = self._own_slo_by_rank.get(rank)  # (its batches filled for its objective less two batch times)
                if slo_s is None:
                    share += forecast.share_of(rate, healthy)
                    continue
                # Its objective sends a batch each time it fills what its objective less two batch times lets
                # it (`forced`); lower tiers' requests of the same buckets ride in those batches, and of their
                # time only what the riders would not have taken in full batches of their own counts: the
                # forced share less the riders' part lately, or what its batches took lately where that is
                # more (at most the forced share, at least its share in full batches). Without it free's wait
                # beside enterprise's 600 ms at half load read 1.6 times too long, refusing 10% of free.
                forced = forecast.share_of(rate, healthy, max(0.0, slo_s - 2 * forecast.batch_s))
                taken_s, taken_share = batcher.time_taken(rank, now)
                share += max(forecast.share_of(rate, healthy), forced * taken_share, min(forced, taken_s / healthy))
        wait, every = forecast.waits_s(ahead, bucket, healthy, first_free_s, share, sigmas, alone)
        if bucket is not None and 0 < ahead.get(bucket, 0) < self.costs.size_limit(bucket) and len(ahead) > 1:
            # It joins its bucket's partial batch, which goes when its oldest request's turn comes (work
            # of other buckets that arrived after that one goes after it): that request's predicted start.
            start = batcher.next_start(bucket)
            if start is not None:
                if due is not None:  # (the rule's deadline trigger, once it has joined)
                    start = min(start, latest_start(now, due, self.costs.safe_estimate(ahead[bucket] + 1, bucket)))
                wait = max(start - now, first_free_s)
        promote_s = self._promote_after_s.get(tier) if tier is not None else None
        if promote_s is not None:  # promoted, it goes next
            wait = min(wait, promote_s + 2 * forecast.batch_s)
            every = min(every, promote_s + 2 * forecast.batch_s)
        return wait, every, ahead

    def _running_s(self, batch: Batch) -> float:
        """How long a batch now running is expected to take in all."""
        return self.forecast.batch_cost_s(batch.size, batch.bucket)

    def observe_wait_error(self, tier: str, error_s: float) -> None:
        """A request waited `error_s` longer (or shorter: negative) than predicted when it was queued."""
        histogram = self.wait_error.get(tier)
        if histogram is None:
            histogram = self.wait_error[tier] = Histogram(WAIT_ERROR_BUCKETS_S)
        histogram.observe(error_s)


def _tighter(model_slo_ms: float | None, tier_slo_ms: float | None) -> float | None:
    """The tighter of a model's and a tier's latency objective, in seconds, if either sets one."""
    objectives = [ms for ms in (model_slo_ms, tier_slo_ms) if ms]
    return min(objectives) / 1000.0 if objectives else None
