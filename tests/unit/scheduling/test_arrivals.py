"""How fast requests arrive, as the batcher learns it (`scheduling.arrivals.Rate`)."""

from __future__ import annotations

import math
import random

import pytest

from inferd.scheduling.arrivals import BESIDE_S, RATE_WINDOW_S, CallMix, Rate


def test_a_steady_rate_reads_about_itself_and_fades_once_arrivals_stop() -> None:
    rate = Rate()
    for i in range(2000):  # 200 a second for 10 s
        rate.add(i / 200)
    assert rate.per_s(10.0) == pytest.approx(200.0, rel=0.1)
    assert rate.per_s(13.0) < 0.06 * rate.per_s(10.0)  # three windows later: e^-3 of it


@pytest.mark.parametrize("per_s", [200.0, 1000.0])
def test_a_busy_steady_rate_reads_itself_within_a_percent(per_s: float) -> None:
    """Many arrivals a decay step: each counted as of the step's start, where the score stands, not as if
    it came at that start (which read steady rates 2-3% low from 100 a second up)."""
    rng, rate, now, reads, read_at = random.Random(7), Rate(), 0.0, [], 5.0
    while now < 60.0:  # Poisson arrivals; read at random moments past the first window's few
        now += rng.expovariate(per_s)
        while read_at < now:
            reads.append(rate.per_s(read_at))
            read_at += rng.uniform(0.0, 0.02)
        rate.add(now)
    assert sum(reads) / len(reads) == pytest.approx(per_s, rel=0.01)


def test_a_rate_that_starts_is_read_over_at_least_half_a_window() -> None:
    rate = Rate()
    rate.add(5.0)
    assert rate.per_s(5.0) == 1.0 / (RATE_WINDOW_S / 2)  # one event is not a rate of thousands
    assert rate.per_s(5.0 + 0.75 * RATE_WINDOW_S) == pytest.approx(1.0 / (0.75 * RATE_WINDOW_S) * math.exp(-0.75))


def test_the_rate_read_is_the_formula_s_own_number() -> None:
    """Read per request without min, max and an exponential per read: the very number of
    score x exp(min(0, at - now) / W) / min(W, max(W / 2, now - since))."""
    rng = random.Random(3)
    for _ in range(2000):
        rate = Rate()
        rate.score, rate.since = rng.uniform(0, 500), rng.choice([-math.inf, rng.uniform(0, 10)])
        rate.at = rng.uniform(rate.since if rate.since > 0 else 0, 12)
        now = rng.choice([rate.at, rate.at + rng.uniform(0, 3), rate.since + RATE_WINDOW_S / 2, rate.since + RATE_WINDOW_S])
        if now < rate.since:
            continue
        span = min(RATE_WINDOW_S, max(RATE_WINDOW_S / 2, now - rate.since))
        assert rate.per_s(now) == rate.score * math.exp(min(0.0, rate.at - now) / RATE_WINDOW_S) / span


def test_short_calls_are_beside_large_ones_while_both_came_within_the_window():
    mix = CallMix()
    assert not mix.beside(True, 0.0)  # short calls alone
    assert not mix.beside(True, 100.0)
    assert mix.beside(False, 100.0 + BESIDE_S / 2)  # a large one: both within the window
    assert mix.beside(False, 100.0 + BESIDE_S * 0.99)
    assert not mix.beside(False, 100.0 + BESIDE_S)  # bulk work alone for the window: no longer
    assert mix.beside(True, 100.0 + BESIDE_S * 1.5)
