"""What the batcher learns from arrivals: how fast requests come, and whether closed-loop clients are
echoing the batch just finished (and per tier, how fast each tier's requests come: a lower tier's wait
is stretched by the higher tiers' arrivals, `models.timeliness`).

The echo: closed-loop clients (each sends again as soon as it is answered) whose number is near the
batch size can split into two groups whose batches alternate half full, forever, since each group is
stale when a worker frees. When most of a finished batch's requests come back within the echo window
(`max_wait_ms`) of it and the rest of the cycle is quiet, the cycle "echoed"; past a score, a worker
that frees with a stale, partial queue waits for the echo of the batch it just finished, so the groups
merge. Open-loop traffic arrives at the same rate inside and outside that window, so it is never held.

The call mix: whether short calls (a single request, or a call of a few inputs) come beside large ones,
for which the batcher keeps batches short (`CallMix`).
"""

from __future__ import annotations

import math

RATE_WINDOW_S = 1.0  # rates are counts decaying with this time constant...
RATE_STEP_S = 0.05  # ...applied in steps this long (no exponential per event)
_HALF_WINDOW_S = RATE_WINDOW_S / 2
ECHO_SCORE_TO_HOLD = 0.5  # the moving average of "this cycle echoed" past which a free worker waits
_ECHO_ALPHA = 0.3
BESIDE_S = 30.0  # short calls are beside large ones while an input of each came within this long


class Rate:
    """An event rate: a count that decays exponentially with `RATE_WINDOW_S` (a steady rate r holds
    about r x RATE_WINDOW_S), the decay applied every `RATE_STEP_S` rather than at every event; an event
    between two decays is weighed as the score stands, as of the last one (counted as if it came then, a
    busy steady rate read itself 2-3% low). Until a window has passed since its first event, the count is
    over the time since then, but at least half a window (a first event or two are not a rate): a rate
    that starts is known twice as soon."""

    __slots__ = ("score", "at", "since")

    def __init__(self) -> None:
        self.score = 0.0
        self.at = 0.0  # when the decay was last applied
        self.since = -math.inf  # its first event

    def add(self, now: float, amount: float = 1.0) -> None:
        since_decay = now - self.at
        if since_decay >= RATE_STEP_S:
            if self.since == -math.inf:
                self.since = now
            self.decay(now)
        elif since_decay > 0.0:
            # weighed as at `at`, where the score stands: e^(since_decay / W), within 0.13% as 1 + x (an arrival
            # stamped before the last decay, prepared late, counts as it is)
            amount *= 1.0 + since_decay / RATE_WINDOW_S
        self.score += amount

    def decay(self, now: float) -> None:
        self.score *= math.exp((self.at - now) / RATE_WINDOW_S)
        self.at = now

    def per_s(self, now: float) -> float:
        # (min(W, max(W / 2, age)) and exp(min(0, at - now) / W) without the calls: read per request)
        age = now - self.since
        span = RATE_WINDOW_S if age >= RATE_WINDOW_S else age if age > _HALF_WINDOW_S else _HALF_WINDOW_S
        behind = self.at - now
        return self.score * (math.exp(behind / RATE_WINDOW_S) if behind < 0.0 else 1.0) / span


class Echo:
    """Scores each cycle (from one batch's end to the next's) for the closed-loop echo."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.score = 0.0
        self.holds = 0  # times a free worker waited for an echo
        self.cycle_start = 0.0  # when the last batch finished
        self._cycle_size = 0  # how many requests it answered
        self.in_window = 0  # arrivals within the window after it...
        self.after = 0  # ...and after, until the next batch finished

    def arrived(self, now: float) -> None:
        """A request arrived (counted for the cycle in progress)."""
        if self.cycle_start:
            if now - self.cycle_start <= self.window_s:
                self.in_window += 1
            else:
                self.after += 1

    def batch_finished(self, now: float, answered: int) -> None:
        """Score the cycle since the previous batch finished, and start the next one."""
        length = now - self.cycle_start
        if self.cycle_start and self._cycle_size and length > 2 * self.window_s > 0:
            rate_in = self.in_window / self.window_s
            rate_after = self.after / (length - self.window_s)
            echoed = self.in_window >= self._cycle_size / 2 and rate_in >= 4 * rate_after
            self.score += _ECHO_ALPHA * (float(echoed) - self.score)
        self.cycle_start, self._cycle_size = now, answered
        self.in_window = self.after = 0

    @property
    def expected(self) -> bool:
        """Closed-loop clients echo the batches: a stale, partial queue is worth holding for them."""
        return self.score >= ECHO_SCORE_TO_HOLD


class CallMix:
    """When an input of a short call, and of a large one, last came: short calls are beside large ones
    while both came within `BESIDE_S` (a short call every half a minute keeps it so; bulk work alone
    for that long ends it)."""

    __slots__ = ("short_at", "large_at")

    def __init__(self) -> None:
        self.short_at = self.large_at = -math.inf

    def beside(self, short: bool, now: float) -> bool:
        """Note an input of a `short` call (else a large one's) at `now`; whether both kinds come now."""
        if short:
            self.short_at = now
        else:
            self.large_at = now
        return now - self.large_at < BESIDE_S and now - self.short_at < BESIDE_S
