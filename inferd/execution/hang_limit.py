"""How long one backend call may run before its worker is given up on: the larger of a floor and a
multiple of the recent calls' p99. The pool's watchdog reads it; delivery feeds it each call's time.
"""

from __future__ import annotations

from collections import deque


class HangLimit:
    """The hang limit of one model's calls, from their recent durations (what the watchdog reads)."""

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
