"""The circuit breaker's state machine."""

from __future__ import annotations

from inferd.execution.breaker import BreakerState, CircuitBreaker


def test_the_breaker_opens_after_consecutive_failures_and_a_probe_decides():
    breaker = CircuitBreaker(failures_to_open=3, cooldown_s=5.0)
    assert not breaker.record(False, 0.0) and not breaker.record(False, 1.0)
    assert breaker.record(True, 2.0) is False and breaker.consecutive_failures == 0  # a success resets
    for t in (3.0, 4.0):
        assert not breaker.record(False, t)
    assert breaker.record(False, 5.0) and breaker.state is BreakerState.OPEN
    assert breaker.refusal_s(7.0) == 3.0  # open: refuse for the rest of the cool-down
    assert breaker.refusal_s(10.0) is None and breaker.state is BreakerState.HALF_OPEN  # the probe may go
    assert breaker.record(False, 10.5) and breaker.state is BreakerState.OPEN  # the probe failed: open again
    assert breaker.refusal_s(16.0) is None
    breaker.record(True, 16.1)
    assert breaker.state is BreakerState.CLOSED
