"""The pieces of fault handling that keep state: the circuit breaker, the hang limit, the dead-letter log.

The actions live elsewhere (re-queueing and failing requests in the batch model, replacing workers in
the pool); these classes only decide and remember.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from enum import Enum
from typing import Any

from ..errors import describe
from ..messages import PendingRequest


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


class BatchLatencies:
    """Recent backend call durations, for the hang watchdog's limit."""

    def __init__(self, floor_s: float, multiple: float = 3.0, window: int = 256) -> None:
        self.floor_s = floor_s
        self.multiple = multiple
        self._recent: deque[float] = deque(maxlen=window)
        self._limit_s = floor_s
        self._since_update = 0

    def observe(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._since_update += 1
        if self._since_update >= 16 or len(self._recent) < 16:
            self._since_update = 0
            ordered = sorted(self._recent)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            self._limit_s = max(self.floor_s, self.multiple * p99)

    @property
    def limit_s(self) -> float:
        """How long one call may run before the worker is given up on."""
        return self._limit_s


class DeadLetters:
    """The inputs isolated as poison: bounded, and holding a hash and length rather than the input itself."""

    def __init__(self, capacity: int = 1000) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.total = 0

    def add(self, request: PendingRequest, model: str, error: BaseException) -> None:
        text = request.raw if request.raw is not None else request.input
        text = text if isinstance(text, str) else repr(text)
        self.total += 1
        self._entries.append(
            {
                "request_id": request.request_id,
                "model": model,
                "input_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
                "input_length": len(text),
                "error": describe(error, 500),
                "at": time.time(),
            }
        )

    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)
