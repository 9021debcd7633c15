"""A model's circuit breaker: it decides when to stop feeding a model whose batches keep failing and when
to let a probe through; the batch model acts on what it decides (failing what waits, refusing at once).
"""

from __future__ import annotations

from enum import Enum


class BreakerState(Enum):
    """Where a circuit breaker stands."""

    CLOSED = "closed"  # feeding the model
    OPEN = "open"  # refusing: batches kept failing
    HALF_OPEN = "half_open"  # cool-down over: the next batch is the probe


class CircuitBreaker:
    """Stops feeding a model whose batches keep failing outright; lets one probe through after a cool-down.

    A batch in which some requests succeeded (a poison input isolated) is a success: only a model that
    fails everything it is given trips the breaker.
    """

    def __init__(self, failures_to_open: int, cooldown_s: float) -> None:
        self.failures_to_open = failures_to_open
        self.cooldown_s = cooldown_s
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0

    def refusal_s(self, now: float) -> float | None:
        """Seconds until requests may come again, or None when they may come now."""
        if self.state is BreakerState.OPEN:
            left = self.opened_at + self.cooldown_s - now
            if left > 0:
                return left
            self.state = BreakerState.HALF_OPEN
        return None

    def record(self, succeeded: bool, now: float) -> bool:
        """Record a finished batch; True when this opened the breaker."""
        if succeeded:
            self.consecutive_failures = 0
            self.state = BreakerState.CLOSED
            return False
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN or self.consecutive_failures >= self.failures_to_open:
            self.state = BreakerState.OPEN
            self.opened_at = now
            return True
        return False
