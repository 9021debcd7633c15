"""What a model's load predicts: the time a batch takes, the requests per second it can serve, and how
long a request queued now would wait.

Pure arithmetic on what it is told: the batch times it observes, and at each question the queue ahead,
the healthy workers and how soon one is free. Reading never changes it; the capacity reference that
rate limits scale against moves only when `note_capacity` is called (a worker ready or a batch done).
"""

from __future__ import annotations

import math

EWMA_ALPHA = 0.2


class LoadModel:
    """Estimates for one batch model with `max_batch_size` requests per batch."""

    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.batch_s = 0.0  # exponentially weighted mean of the backend call time; 0: not measured yet
        self.peak_capacity_rps = 0.0  # the best capacity noted: what rate limits are scaled against

    def observe_batch(self, seconds: float) -> None:
        """A backend call took `seconds` (the first one, e.g. a warm-up call, sets the estimate)."""
        self.batch_s = seconds if not self.batch_s else self.batch_s + EWMA_ALPHA * (seconds - self.batch_s)

    def capacity_rps(self, healthy: int) -> float:
        """Requests/s `healthy` workers sustain: full batches at the estimated batch time."""
        return healthy * self.max_batch_size / self.batch_s if self.batch_s else 0.0

    def note_capacity(self, healthy: int) -> None:
        self.peak_capacity_rps = max(self.peak_capacity_rps, self.capacity_rps(healthy))

    def capacity_scale(self, healthy: int) -> float:
        """Capacity now as a share of the best noted: what rate limits are multiplied by."""
        return self.capacity_rps(healthy) / self.peak_capacity_rps if self.peak_capacity_rps else 1.0

    def predicted_wait_s(self, ahead: int, healthy: int, first_free_s: float) -> float:
        """How long a request with `ahead` requests before it would wait for its batch to start: until a
        worker is free, then one batch time per full round of the requests ahead."""
        if healthy == 0 or not self.batch_s:
            return math.inf if ahead else 0.0
        return first_free_s + ahead // (self.max_batch_size * healthy) * self.batch_s
