"""The margin admission adds to a prediction, on a fake clock: calibrated on how far batches ran from
their estimates, growing with the work ahead as independent errors add up, and fading after a stall
whether batches run or not."""

from __future__ import annotations

import math
import random

import pytest

from inferd.scheduling import prediction_errors as module
from inferd.scheduling.prediction_errors import HALF_LIFE_S, MIN_EXCESS, PredictionErrors


def feed(errors: PredictionErrors, ratios: list[float], start: float, every_s: float = 0.02) -> float:
    """One batch every `every_s` from `start`, each `ratio` times its estimate; returns the time after."""
    at = start
    for ratio in ratios:
        errors.observe(ratio, at)
        at += every_s
    errors.refresh(at)
    return at


def test_nothing_observed_gives_the_floor_and_exact_batches_keep_it():
    errors = PredictionErrors()
    errors.refresh(0.0)
    assert errors.bias == 0.0 and errors.batch_excess == MIN_EXCESS
    feed(errors, [1.0] * 200, 0.0)
    assert errors.batch_excess == MIN_EXCESS


def test_the_margin_follows_injected_errors_up_and_back_down():
    errors = PredictionErrors()
    rng = random.Random(3)
    at = feed(errors, [1.0] * 200, 0.0)
    at = feed(errors, [math.exp(rng.gauss(0.0, 0.3)) for _ in range(400)], at)  # a busy host: ~30% either way
    noisy = errors.batch_excess
    assert 0.6 < noisy < 1.4  # the 99th percentile of e^N(0, 0.3) - 1 is ~1.0
    at = feed(errors, [1.0] * 400, at)  # 8 s of batches as estimated again: on its way down
    assert errors.batch_excess < 0.75 * noisy
    feed(errors, [1.0] * 600, at)  # 12 s more: the noisy spell has faded
    assert errors.batch_excess == pytest.approx(MIN_EXCESS, abs=0.005)


def test_a_stall_widens_the_margin_briefly_then_fades_with_batches_or_with_time_alone():
    busy, idle = PredictionErrors(), PredictionErrors()
    for errors in (busy, idle):
        at = feed(errors, [1.0] * 100, 0.0)
        errors.observe(9.0, at)  # one batch held up: a collector pause, a preempted process
        errors.refresh(at)
        assert errors.batch_excess == pytest.approx(8.0, rel=0.05)
    feed(busy, [1.0] * 150, at + 0.02)  # 3 s of batches as estimated
    assert busy.batch_excess == pytest.approx(MIN_EXCESS, abs=0.005)
    idle.refresh(at + 10 * HALF_LIFE_S)  # nothing ran: the stall fades all the same
    assert idle.batch_excess == pytest.approx(MIN_EXCESS, abs=0.005)


def test_the_margin_grows_as_the_square_root_of_the_work_ahead_and_never_past_what_batches_justify():
    errors = PredictionErrors()
    rng = random.Random(5)
    feed(errors, [max(0.2, 1.0 + rng.gauss(0.0, 0.2)) for _ in range(500)], 0.0)
    one = errors.margin_s(0.1, 0.1)
    assert one == pytest.approx(errors.batch_excess * 0.1)  # one batch: its own 99th percentile
    hundred = errors.margin_s(10.0, 0.1)  # a hundred batches ahead: ~10x one batch's margin, not 100x
    assert 8 * one < hundred < 15 * one
    for total in (0.05, 0.1, 1.0, 10.0, 100.0):
        assert errors.margin_s(total, 0.1) <= errors.batch_excess * total + 1e-12
    assert errors.margin_s(0.0, 0.1) == 0.0


def test_a_bias_the_estimates_have_not_caught_up_with_counts_in_full():
    errors = PredictionErrors()
    feed(errors, [1.5] * 300, 0.0)  # every batch 50% over its estimate
    assert errors.bias == pytest.approx(0.5, abs=0.03)
    assert errors.margin_s(10.0, 0.1) >= 0.5 * 10.0


def test_a_percentile_is_not_read_from_two_or_three_batches_until_recent_ones_weigh_twelve():
    """A model of 1-3 s batches keeps two or three of them in a half-life: one single-input batch at 2.1x
    its estimate set the 90th percentile, and an onset's first settled batch (2.6x) the median, refusing
    requests with 3 s of a 10 s deadline to spare. Until recent batches weigh `EVIDENCE`, batches as
    estimated make up the rest; the 99th (an objective's) still holds the one slow batch."""
    errors = PredictionErrors()
    errors.observe(3.2, 0.0)
    errors.refresh(0.0)  # (read the instant it is observed: its whole weight)
    assert errors.bias == 0.0 and errors.deadline_spread == MIN_EXCESS
    assert errors.spread == pytest.approx(2.2, rel=0.05)
    errors = PredictionErrors()
    feed(errors, [2.6], 0.0, every_s=2.0)
    assert errors.bias == 0.0 and errors.deadline_spread == MIN_EXCESS
    assert errors.spread == pytest.approx(1.6, rel=0.05)
    feed(errors, [1.0, 2.1, 1.0], 2.0, every_s=2.0)  # a few more: the 90th still is not one batch's
    assert errors.deadline_spread == MIN_EXCESS
    busy = PredictionErrors()  # as many slow batches, among enough batches to read the 90th from
    feed(busy, [1.0] * 16 + [2.1] * 4, 0.0)
    assert errors.bias == busy.bias == 0.0 and busy.deadline_spread == pytest.approx(1.1, rel=0.05)


def test_a_deadline_alone_holds_the_90th_percentile_and_an_objective_the_99th():
    errors = PredictionErrors()
    rng = random.Random(7)
    feed(errors, [math.exp(rng.gauss(0.0, 0.3)) for _ in range(2000)], 0.0)  # ~30% either way
    assert 0.35 < errors.deadline_spread < 0.6  # e^(1.28 x 0.3) - 1 = 0.47
    assert 0.8 < errors.spread < 1.25  # e^(2.33 x 0.3) - 1 = 1.01
    assert errors.margin_s(1.0, 0.1, deadline=True) < 0.6 * errors.margin_s(1.0, 0.1)


def _figures_over_every_bin(errors: PredictionErrors, now: float) -> tuple[float, float, float]:
    """`refresh`'s bias and spreads by their definition: the weight above each bin, over all 81 of them."""
    scale = math.exp(-(now - errors._origin) / errors._tau)
    observed = sum(errors._weights) * scale
    prior = max(module.PRIOR_WEIGHT, module.EVIDENCE - observed)
    total = prior + observed
    above, quantiles, median = 0.0, {}, None
    for i in range(module._BINS - 1, -1, -1):
        above += errors._weights[i] * scale + (prior if i == module._EXACT_BIN else 0.0)
        for q in (module.QUANTILE, module.DEADLINE_QUANTILE):
            if q not in quantiles and above > (1.0 - q) * total:
                quantiles[q] = math.exp(module._LOG_LO + i * module._BIN) - 1.0
        if above >= 0.5 * total:
            median = math.exp(module._LOG_LO + i * module._BIN) - 1.0
            break
    bias = max(0.0, median or 0.0)
    spread, deadline = (max(MIN_EXCESS, quantiles.get(q, 0.0) - bias) for q in (module.QUANTILE, module.DEADLINE_QUANTILE))
    return bias, spread, deadline


def test_the_figures_read_from_the_highest_bin_with_weight_are_those_of_every_bin():
    rng = random.Random(11)
    errors, at = PredictionErrors(), 0.0
    for _ in range(60):  # spells of batches below, at and above their estimates, stalls among them
        sigma, shift = rng.choice([0.0, 0.05, 0.3, 1.0]), rng.choice([-0.5, 0.0, 0.2, 1.5])
        for _batch in range(rng.randrange(1, 40)):
            errors.observe(math.exp(shift + rng.gauss(0.0, sigma)), at)
            at += rng.choice([0.01, 0.2, 2.0])
        errors.refresh(at)
        assert (errors.bias, errors.spread, errors.deadline_spread) == _figures_over_every_bin(errors, at)
