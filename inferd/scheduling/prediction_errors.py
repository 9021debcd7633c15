"""How far batches have recently run from their estimates, and the margin a prediction adds for it.

Admission refuses a request whose predicted completion, with a margin, ends past its due. A margin that
is too small lets requests in to miss; one that is too large refuses work the model could have done (a
busy host's CPU model: batch times vary threefold, and a margin that multiplied the whole predicted time
by its worst case refused 96% of requests with ten times the time they needed). So the margin is
calibrated on what happened:

- every batch's excess over its estimate (actual / estimated - 1) is kept, weighted by its age (half of
  its weight gone every `HALF_LIFE_S`), beside a prior that never fades: batches that ran exactly as
  estimated, one of them, or as many as the recent batches weigh less than `EVIDENCE` (a model of
  1-3 s batches has two or three in a half-life: read alone, one single-input batch at 2.1x its
  estimate set the 90th percentile, and an onset's first settled batch set the median, refusing requests
  that had 3 s to spare);
- a prediction of `total` seconds made of batches of up to `batch` seconds adds the recent median excess
  (a bias the estimates have not caught up with yet; the median, so that one stall is not every
  batch's) times `total`, plus a high percentile's distance above that median times sqrt(total x
  batch): the errors of independent batches add up as their variances do, so the margin of n batches
  grows as sqrt(n), not n. One batch's margin is that percentile of one batch's excess; never more
  than that times `total` (what the recent batches justify);
- which percentile is the refusal's purpose: the 99th for a latency objective (it is a p99), the 90th
  for a deadline alone. A request refused for its deadline is lost at once, while one admitted that
  then misses ends in a 504 no later than it, and is never computed once expired: at the 99th a
  deadline refused requests with up to a 99% chance of being answered in time;
- a stall (a collector, a preempted process) is one large excess: it widens the margin while it is
  among the recent batches, and fades as newer batches outweigh it or as time passes, batches or none,
  so a model that refuses everything is not held there by a figure nothing can correct.

Excess is kept in fixed bins of its logarithm, so a batch costs O(1) and a question O(bins), asked at
most once per `TICK_S` (then kept). Written and read on the event loop.
"""

from __future__ import annotations

import math

HALF_LIFE_S = 3.0
MIN_EXCESS = 0.1  # the least a batch's margin is: scheduling noise, the response's own time
PRIOR_WEIGHT = 1.0  # the prior (a batch that ran as estimated) counts as this many batches...
EVIDENCE = 12.0  # ...or as many as the recent batches' weight falls short of this (over ten: one batch
# alone is never a tenth of the weight, so never the 90th percentile; at ten exactly, a batch read the
# instant it was observed weighed 1.0000000000000002 and was the 90th alone, refusing for a tick)
QUANTILE = 0.99  # a latency objective's margin (and one batch's, for decisions that must not be late)
DEADLINE_QUANTILE = 0.9  # a deadline's alone (see the module docstring)
TICK_S = 0.25  # the margin's figures are made again at most this often (and after each batch)
_LOG_LO, _LOG_HI, _BIN = -1.0, 3.0, 0.05  # ratio bins from e^-1 (0.37x) to e^3 (20x), 5% wide
_BINS = int((_LOG_HI - _LOG_LO) / _BIN) + 1
_EXACT_BIN = round(-_LOG_LO / _BIN)  # the bin of batches that ran as estimated, where the prior sits
_RESCALE_S = 30 * HALF_LIFE_S  # weights are kept as exp(age / tau) from an origin moved on this often


class PredictionErrors:
    """The recent distribution of batches' actual time against their estimate, for one model version."""

    def __init__(self) -> None:
        self._tau = HALF_LIFE_S / math.log(2)
        self._weights = [0.0] * _BINS  # by bin of log(actual / estimated), in units of exp((t - origin) / tau)
        self._origin = 0.0
        self._made_at = -math.inf  # when `bias` and `spread` were made
        self._dirty = False
        self._top = _EXACT_BIN  # the highest bin with any weight (the prior's, or the highest observed since)
        self.bias = 0.0  # the recent median excess, at least 0
        self.spread = MIN_EXCESS  # the 99th percentile's excess above `bias`, at least MIN_EXCESS (scheduling noise)
        self.deadline_spread = MIN_EXCESS  # the same of the 90th percentile (`DEADLINE_QUANTILE`)
        self.observed = 0

    def observe(self, ratio: float, at: float) -> None:
        """A batch took `ratio` times its estimate, at `at` (seconds, the model's clock)."""
        if not ratio > 0:
            return
        if at - self._origin > _RESCALE_S:
            shrink = math.exp(-(at - self._origin) / self._tau)
            self._weights = [w * shrink for w in self._weights]
            self._origin = at
        index = min(_BINS - 1, max(0, round((math.log(ratio) - _LOG_LO) / _BIN)))
        self._weights[index] += math.exp((at - self._origin) / self._tau)
        if index > self._top:
            self._top = index
        self.observed += 1
        self._dirty = True

    def refresh(self, now: float) -> bool:
        """Make `bias` and `spread` again if a batch came in or a tick passed since; True if they changed."""
        if not self._dirty and now - self._made_at < TICK_S:
            return False
        self._made_at, self._dirty = now, False
        scale = math.exp(-(now - self._origin) / self._tau)
        weights = self._weights
        observed = sum(weights) * scale
        prior = max(PRIOR_WEIGHT, EVIDENCE - observed)
        total = prior + observed
        upper, lower = (1.0 - QUANTILE) * total, (1.0 - DEADLINE_QUANTILE) * total  # the weight above each
        quantile = deadline_quantile = median = None
        above = 0.0
        # (from the highest bin with weight: the empty ones above it add nothing, and most batches of a
        # steady model land in a bin or two about the prior's, so this is a few bins, not 81, per batch)
        for i in range(self._top, -1, -1):
            above += weights[i] * scale + (prior if i == _EXACT_BIN else 0.0)
            if quantile is None and above > upper:
                quantile = math.exp(_LOG_LO + i * _BIN) - 1.0
            if deadline_quantile is None and above > lower:
                deadline_quantile = math.exp(_LOG_LO + i * _BIN) - 1.0
            if above >= 0.5 * total:
                median = math.exp(_LOG_LO + i * _BIN) - 1.0
                break
        bias = max(0.0, median or 0.0)
        spread = max(MIN_EXCESS, (quantile or 0.0) - bias)
        deadline_spread = max(MIN_EXCESS, (deadline_quantile or 0.0) - bias)
        changed = bias != self.bias or spread != self.spread or deadline_spread != self.deadline_spread
        self.bias, self.spread, self.deadline_spread = bias, spread, deadline_spread
        return changed

    @property
    def batch_excess(self) -> float:
        """What one batch may take beyond its estimate, as a share of it: the 99th percentile."""
        return self.bias + self.spread

    def margin_s(self, total_s: float, batch_s: float, deadline: bool = False) -> float:
        """What a prediction of `total_s` seconds, in batches of up to `batch_s`, adds to stay on the safe
        side at the 99th percentile, or with `deadline` at the 90th (see the module docstring)."""
        if total_s <= 0.0:
            return 0.0
        spread = self.deadline_spread if deadline else self.spread
        return self.bias * total_s + spread * math.sqrt(total_s * min(batch_s, total_s))

    def describe(self) -> dict[str, float]:
        return {"bias": round(self.bias, 4), "spread": round(self.spread, 4),
                "deadline_spread": round(self.deadline_spread, 4), "batches": self.observed}
