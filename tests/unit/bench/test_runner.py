"""The load generator's summary of a step: when it says it measured itself."""

from __future__ import annotations

from inferd.bench.runner import _generator_summary


def test_a_generator_whose_loop_ran_late_says_so():
    calm = _generator_summary([0.2] * 1000, p50_ms=100.0)
    late = _generator_summary([0.2] * 980 + [12.0] * 20, p50_ms=100.0)  # 2% of its ticks 12 ms late
    assert calm is not None and not calm["busy"] and calm["loop_lag_ms"]["p99"] == 0.2
    assert late is not None and late["busy"] and late["loop_lag_ms"]["max"] == 12.0
    assert _generator_summary([3.0] * 100, p50_ms=20.0)["busy"]  # type: ignore[index]  # late by a tenth of what it measures
    assert _generator_summary([], p50_ms=20.0) is None  # (wrk: no figure)
