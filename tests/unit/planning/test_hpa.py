"""Kubernetes' HPA arithmetic against its documented examples: the ratio, the tolerance, the
stabilisation windows, the default rate limits, several triggers."""

from __future__ import annotations

from inferd.planning.hpa import Hpa, HpaSettings, Trigger


def hpa(target: float = 100.0, average: bool = True, **kw) -> Hpa:  # type: ignore[no-untyped-def]
    return Hpa(HpaSettings((Trigger("m", target, average),), **kw))


def test_the_ratio_doubles_or_halves_and_the_tolerance_holds():
    # "200m against a target of 100m: the replicas are doubled; 50m: halved" (per-pod values)
    assert hpa(down_window_s=0).desired(0, 3, {"m": 3 * 200.0}) == 6
    assert hpa(down_window_s=0).desired(0, 4, {"m": 4 * 50.0}) == 2
    assert hpa().desired(0, 4, {"m": 4 * 108.0}) == 4  # within 10% of the target: no change
    assert hpa().desired(0, 4, {"m": 4 * 112.0}) == 5  # ceil(4 x 1.12)
    assert hpa(target=0.2, average=False).desired(0, 2, {"m": 0.5}) == 5  # a Value target: ceil(2 x 2.5)


def test_scaling_down_takes_the_highest_recommendation_of_its_window():
    h = hpa()
    assert h.desired(0, 4, {"m": 4 * 100.0}) == 4
    assert h.desired(60, 4, {"m": 4 * 25.0}) == 4  # the window still holds the 4 of t=0
    assert h.desired(301, 4, {"m": 4 * 25.0}) == 1  # past 300 s: the highest left is the 1 of t=60
    up = hpa()
    assert up.desired(0, 2, {"m": 2 * 300.0}) == 6  # scaling up: no window by default


def test_the_default_rate_limits_allow_the_larger_of_four_pods_and_doubling_per_period():
    h = hpa(max_replicas=100)
    assert h.desired(0, 1, {"m": 1 * 2000.0}) == 5  # 1 -> 20 asked: max(1 + 4, 2 x 1) = 5
    assert h.desired(5, 5, {"m": 5 * 400.0}) == 5  # within the same 15 s: the period started at 1, so 5 is all
    assert h.desired(16, 5, {"m": 5 * 400.0}) == 10  # a new period: max(5 + 4, 2 x 5) = 10
    assert hpa(max_replicas=7).desired(0, 1, {"m": 10_000.0}) == 5  # and never past max_replicas over time
    assert hpa(min_replicas=2, down_window_s=0).desired(0, 6, {"m": 0.0}) == 2


def test_several_triggers_take_the_largest_count():
    h = Hpa(HpaSettings((Trigger("wait", 0.2, average=False), Trigger("waiting", 200.0)), down_window_s=0))
    assert h.desired(0, 2, {"wait": 0.1, "waiting": 2 * 600.0}) == 6  # waiting says 6, wait says 1
    assert h.desired(30, 6, {"wait": 0.3, "waiting": 0.0}) == 9  # wait says ceil(6 x 1.5)
