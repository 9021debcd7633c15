"""The policies' signals as a cluster reads them: the demand signal is Prometheus' rate() over the scrapes
a query's window holds, the newest of them as old as the policy's scrape makes it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from inferd.planning.hpa import HpaSettings, Trigger
from inferd.planning.policies import demand_policy
from inferd.planning.scaling import Sample, Scaling

JUMP_AT = 100.0  # requests arrive at 100/s until then, 400/s after


def arrived_by(t: float) -> float:
    return 100.0 * min(t, JUMP_AT) + 400.0 * max(0.0, t - JUMP_AT)


class Scraped(Scaling):
    """A fleet's samples every 2.5 s (as the simulator takes them), read at `now`."""

    def __init__(self, now: float, lag_s: float) -> None:
        self.clock = cast(Any, SimpleNamespace(now=now))
        self.hpa_settings = HpaSettings((Trigger("demand", 1.0),), lag_s=lag_s)
        self.samples = [Sample(k * 2.5, 1, 0.0, 0, 0.0, 0.0, arrived_by(k * 2.5)) for k in range(1, int(now / 2.5) + 1)]


def demand_at(now: float, window_s: float, scrape_s: float, last_two: bool = False) -> dict[str, float]:
    policy = demand_policy(100.0, 0.7, window_s=window_s, scrape_s=scrape_s, last_two=last_two)
    return policy.signals(cast(Any, Scraped(now, policy.hpa.lag_s)))


def test_the_rate_is_the_increase_between_the_first_and_last_scrape_in_the_window_over_their_span():
    """rate(...[30s]) scraped every 15 s, asked at 110 s: the newest scrape 7.5 s old (half a scrape), the one
    15 s before it, and none other within 30 s: the rate between 87.5 and 102.5 s."""
    assert demand_at(110.0, 30.0, 15.0)["demand"] == pytest.approx((arrived_by(102.5) - arrived_by(87.5)) / 15.0)
    # scraped every 5 s: six scrapes within the 30 s, the rate over the 25 s from the first to the last
    assert demand_at(110.0, 30.0, 5.0)["demand"] == pytest.approx((arrived_by(107.5) - arrived_by(82.5)) / 25.0)


def test_a_window_holding_fewer_than_two_scrapes_answers_nothing():
    assert demand_at(110.0, 10.0, 15.0) == {}
    assert demand_at(110.0, 30.0, 15.0)  # (the same scrapes, a window that holds two)


def test_a_short_window_on_a_fast_scrape_sees_a_jump_sooner():
    """Five seconds after the rate quadruples, a 10 s window on a 5 s scrape reads it in full (the rate
    between the scrapes at 97.5 and 102.5 s: 250/s, half of that span after the jump), where the
    shipped 30 s window on a 15 s scrape still reads the rate before it."""
    fast, shipped = demand_at(105.0, 10.0, 5.0)["demand"], demand_at(105.0, 30.0, 15.0)["demand"]
    assert fast == pytest.approx(250.0) and shipped == pytest.approx(100.0)


def test_irate_reads_the_last_two_scrapes_whatever_the_scrape_interval():
    """irate(...[1m]): on a 5 s scrape what rate(...[10s]) reads (the last two scrapes); on a 15 s scrape,
    where rate(...[10s]) answers nothing, the rate between its last two."""
    assert demand_at(110.0, 60.0, 5.0, last_two=True) == demand_at(110.0, 10.0, 5.0)
    assert demand_at(110.0, 60.0, 15.0, last_two=True)["demand"] == pytest.approx(
        (arrived_by(102.5) - arrived_by(87.5)) / 15.0)
