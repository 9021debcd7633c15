"""A fixed-bucket histogram recorded on the event loop for a fraction of a microsecond.

prometheus-client's own Histogram takes a lock per observation, which cost several percent at 9,000
req/s; everything recorded here is written on the event loop thread only, so an observation is a
bisect into fixed bounds and a list increment.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)

# Signed: how much longer (+) or shorter (-) a request waited than was predicted when it was queued.
WAIT_ERROR_BUCKETS_S = (
    -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, -0.005, -0.001, 0.0,
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)

# An input's length in tokens (TEI's input-length histogram, for a tokenising backend's inputs).
TOKEN_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class Histogram:
    """Counts per `le` bucket (the last one is +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # `le` buckets: the first bound >= value
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float | None:
        count = self.count
        return self.sum / count if count else None

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count) pairs as the Prometheus text format has them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out
