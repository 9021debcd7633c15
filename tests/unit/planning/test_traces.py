"""The synthetic day's arrivals: thinning decided by the rate's bounds draws what thinning against the
rate itself draws."""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Iterator

import pytest

from inferd.planning.traces import Arrival, DayTrace, drawn_beside


def _thinned_by_the_rate(trace: DayTrace) -> Iterator[Arrival]:
    """The plain thinning: every candidate against the rate at its moment."""
    rng = random.Random(trace.seed)
    top = trace.peak_rps * trace.spike_factor
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= trace.day_s:
            return
        if rng.random() * top <= trace.rate(t):
            bucket = 1 if rng.random() < trace.long_share else 0
            yield Arrival(t, bucket, trace._tier(rng.random()) if trace.tiers else "default")


@pytest.mark.parametrize("trace", [
    DayTrace(day_s=900.0),  # three x4 spikes, one of them over the peak
    DayTrace(day_s=301.0, spikes=(0.0, 0.49), spike_ramp_s=7.0, spike_s=3.0, tiers=(("paid", 0.3), ("free", 0.7)), seed=3),
    DayTrace(day_s=120.0, trough_rps=50.0, peak_rps=50.0, spikes=()),
])
def test_bounded_thinning_draws_the_same_arrivals_as_the_rate_itself(trace: DayTrace) -> None:
    drawn = list(trace.arrivals())
    assert drawn == list(_thinned_by_the_rate(trace))
    assert len(drawn) > 1000 and {a.bucket for a in drawn} == {0, 1}


def test_arrivals_follow_the_rate() -> None:
    trace = DayTrace(day_s=1000.0, spikes=(0.5,), spike_s=100.0)
    arrivals = list(trace.arrivals())
    for start in (0.0, 560.0, 900.0):  # the trough, a spike after its ramp (x4), the day's falling side
        drawn = sum(1 for a in arrivals if start <= a.at < start + 100.0)
        expected = sum(trace.rate(start + i + 0.5) for i in range(100))
        assert drawn == pytest.approx(expected, rel=0.05)
    assert sum(1 for a in arrivals if 560.0 <= a.at < 660.0) > 3 * sum(1 for a in arrivals if 400.0 <= a.at < 500.0)


@pytest.mark.parametrize("trace", [
    DayTrace(day_s=120.0),
    DayTrace(day_s=60.0, tiers=(("paid", 0.3), ("free", 0.7)), seed=3),
])
def test_arrivals_drawn_beside_the_fleet_are_the_trace_s_own_across_chunks(trace: DayTrace) -> None:
    drawn = list(drawn_beside(trace, chunk=1000))
    assert len(drawn) > 3000  # (several chunks, the last a partial one)
    assert drawn == [tuple(a) for a in trace.arrivals()]


def test_a_reader_stopping_early_ends_the_drawing_process() -> None:
    arrivals = drawn_beside(DayTrace(day_s=3600.0), chunk=100)
    assert next(arrivals)[0] > 0.0
    arrivals.close()
    assert not multiprocessing.active_children()


def test_a_drawing_process_that_fails_is_an_error_not_a_hang() -> None:
    with pytest.raises(RuntimeError, match="ended early"):
        list(drawn_beside(DayTrace(day_s=10.0, peak_rps=0.0)))  # (no rate to draw at: it divides by zero)
