"""How late a batch model's recent answers came after their predicted time.

Admission's margin (`timeliness`) is never more than the latest of these: on a busy host, batch times
varying threefold made a margin of twice the prediction where no answer came late at all. An answer's
predicted time is the later of its predicted answer and its predicted start plus the batch that really
formed, as estimated (delivery measures it, `Forecast.settled_batch_cost_s`). More requests joining its
batch than it expected are not a timing error a margin covers: it cannot know arrivals after it (a
closed loop's first request of each cycle joined by seven came 2-3.5 s after its prediction every
cycle, every batch as estimated). Fewer are slack its own prediction held: it came early (an open
loop near capacity, where batches leave before all the joiners expected come).
Written and read on the event loop.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW_S = 30.0  # the answers of this window bound the margin...
SAMPLES = 8  # ...once there are this many of them
REMADE_S = 1.0  # the bound is made again after an answer or this long, not per request (up to 256 to look through)


class Lateness:
    """(when, how late after its prediction) of one model version's recent answers, and the latest."""

    def __init__(self) -> None:
        self._answers: deque[tuple[float, float]] = deque(maxlen=256)
        self._bound: tuple[float, float] | None = None  # (made at, `bound_s`) until an answer comes

    def __len__(self) -> int:
        return len(self._answers)

    def observe(self, lateness_s: float, at: float) -> None:
        """An admitted request was answered `lateness_s` after its predicted time (negative: before)."""
        self._answers.append((at, lateness_s))
        self._bound = None

    def bound_s(self, now: float) -> float:
        """The most an answer of the last `WINDOW_S` came after its prediction (at least 0), once
        `SAMPLES` of them say so; until then none (inf)."""
        kept = self._bound
        if kept is not None and now - kept[0] < REMADE_S:
            return kept[1]
        recent = [late for at, late in self._answers if now - at <= WINDOW_S]
        bound = max(0.0, max(recent)) if len(recent) >= SAMPLES else math.inf
        self._bound = (now, bound)
        return bound
