"""The hang watchdog's limit."""

from __future__ import annotations

from inferd.execution.hang_limit import HangLimit


def test_the_hang_limit_is_a_multiple_of_the_recent_p99_with_a_floor():
    latencies = HangLimit(floor_s=1.0, multiple=3.0)
    for _ in range(100):
        latencies.observe(0.1)
    assert latencies.limit_s == 1.0  # 3 x 0.1 s is under the floor
    for _ in range(300):
        latencies.observe(0.5)
    assert latencies.limit_s == 1.5
