"""The fault state machines: the circuit breaker, the hang limit, the dead-letter log."""

from __future__ import annotations

from inferd.execution.faults import BatchLatencies, BreakerState, CircuitBreaker, DeadLetters
from inferd.messages import PendingRequest


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


def test_the_hang_limit_is_a_multiple_of_the_recent_p99_with_a_floor():
    latencies = BatchLatencies(floor_s=1.0, multiple=3.0)
    for _ in range(100):
        latencies.observe(0.1)
    assert latencies.limit_s == 1.0  # 3 x 0.1 s is under the floor
    for _ in range(300):
        latencies.observe(0.5)
    assert latencies.limit_s == 1.5


def test_dead_letters_keep_a_hash_and_length_never_the_input():
    letters = DeadLetters(capacity=2)
    for i in range(3):
        request = PendingRequest(f"r{i}", f"secret input {i}", 0.0, 1.0, None)  # type: ignore[arg-type]
        letters.add(request, "m", ValueError("poison"))
    entries = letters.entries()
    assert letters.total == 3 and [e["request_id"] for e in entries] == ["r1", "r2"]  # bounded
    assert all("secret" not in str(e) for e in entries)
    assert entries[0]["input_length"] == len("secret input 1") and entries[0]["error"] == "ValueError: poison"
