"""What the batcher learns from arrivals: how fast requests come, and whether closed-loop clients are
echoing the batch just finished (and per tier, how fast each tier's requests come: a lower tier's wait
is stretched by the higher tiers' arrivals, `models.timeliness`).

The echo: closed-loop clients (each sends again as soon as it is answered) split into batches that
alternate for ever: a worker that frees finds the other group stale and sends it alone, or finds
nothing and sends the first of its own clients to come back alone (a lone request is not worth a
linger), and either way every request waits for a whole batch of the others (10 clients on a 100 ms
function: batches of 1 and 4, p50 220 ms, half of one batch per cycle). A cycle (one batch's end to
the next's) "echoed" when most of what the batch answered came back in the cycle's first quarter, four
times as densely as in its second half, or (a batch of `WHOLE_BURST` or more) all of it early with
nothing after, early enough that an open loop's arrivals would all come that early once in 20 cycles
(of a cycle's first f, f^n: a fifth of it for 2 requests, 3/4 at most from 10): a closed loop comes
back in a burst, however long its clients' turnaround (wrk's 1-3 ms; a Python client reading 10
answers one by one, 2-7 ms of a 12 ms cycle; a loaded one's 20-35 ms at 50 clients), an open loop
comes alike all through the cycle; a cycle of fewer than `EVIDENCE` moves the score in proportion.
Past a score, a worker that frees is held for the connections its batch just answered (each request
names its connection: `messages.Client`): their batch leaves the moment the last of them sent again,
or as many requests came as it answered (a client's pool may send on any of its connections), and at
the latest when the first of them to come has lingered its linger (or a
batch's time passed without any): one batch per cycle, each request waiting one batch and its clients'
turnaround. Where a client's echo spreads past the linger (a loaded Python client sends a few at once
and the rest 15-55 ms later), the first one's wait stretches to the spread lately seen (a whole echo's
arrivals after its first as far as they are worth waiting for, the highest of late, plus a quarter) but
to `HOLD_WITHIN` of a batch's time at most: the late ones would otherwise wait a whole batch more, and
the clients split into two groups. Worth waiting for: up to the arrival where the echo's requests wait
least in all, those in from their arrival to it and the rest a batch each (`_worth_waiting_s`): an echo
spread evenly over less than a batch is waited for whole, a few clients that think long are not.
A deadline or objective still sends a batch whenever it must (`policy`). A connection that
did not come back within two holds in a row is not waited for again (`Client.slow`) until it comes
back while a worker is held; requests on no known connection (gRPC, in-process) are counted back.

The call mix: whether short calls (a single request, or a call of a few inputs) come beside large ones,
for which the batcher keeps batches short (`CallMix`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from ..messages import Client

RATE_WINDOW_S = 1.0  # rates are counts decaying with this time constant...
RATE_STEP_S = 0.05  # ...applied in steps this long (no exponential per event)
_HALF_WINDOW_S = RATE_WINDOW_S / 2
ECHO_SCORE_TO_HOLD = 0.5  # the moving average of "this cycle echoed" past which a free worker waits
HOLD_WITHIN = 0.75  # ...for an echo back within this share of a batch's time
WHOLE_BURST = 2  # from a batch this large, the whole echo back early in a cycle, then nothing, is one too:
BY_CHANCE = 0.05  # early enough that an open loop's as many arrivals would all come that early once in 20 cycles
WHOLE_WITHIN = 0.75  # (n arrivals spread alike over a cycle all come in its first f with chance f^n), within 3/4
EVIDENCE = 4  # a cycle of fewer requests moves the score in proportion (a light open loop's come early by chance)
_ECHO_ALPHA = 0.3
SPREAD_MARGIN = 1.25  # a hold stretched for an echo's spread waits this much longer than the spread seen...
_SPREAD_FALL = 0.05  # ...the highest of late: a loaded client's spread varies by half from cycle to cycle
CYCLE_ARRIVALS = 1024  # the arrivals of a cycle whose times the echo's score reads
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
    """Scores each cycle for the closed-loop echo, and holds a free worker for the connections its batch
    answered (see the module docstring). Under the batcher's lock."""

    def __init__(self) -> None:
        self.score = 0.0
        self.echo_s = 0.0  # how long after its batch an echo's burst ends, lately
        self.spread_s = 0.0  # how long after its first arrival an echo is worth waiting for: the highest of late
        self.cycle_start = 0.0  # when the last batch finished
        self._cycle_size = 0  # how many requests it answered
        self._offsets: list[float] = []  # when each arrival since came, after it (the first CYCLE_ARRIVALS)
        self.arrivals = 0  # how many came since
        self.hold_until = 0.0  # while a free worker is held: when the hold ends at the latest (0: none is)
        self._held_at = 0.0
        self._capped = False  # the hold's end is already the first arrival's linger
        self._stretch_s = 0.0  # how long past the first arrival the hold lasts where that is longer than the linger
        self._awaited: set[Client] = set()  # the connections it is held for, until each sends again...
        self._returning: set[Client] = set()  # (the last batch's connections not back yet, where not held for)
        self._counted = False  # ...and whether some requests came on no known connection (counted back)
        self.holds = 0  # times a free worker was held for an echo...
        self.returned = 0  # ...of them, times the echo came back whole (its batch left at once)...
        self.cut = 0  # ...and times the batch left before (the first one's linger, a full batch, a deadline)
        self.held_s = 0.0  # ...and how long they held, in all
        self.slow = 0  # times a connection was found slow (two holds in a row without it)

    def arrived(self, now: float, client: Client | None, linger_s: float) -> bool:
        """A request arrived (on `client`'s connection, where known; `linger_s`: its bucket's linger).
        True: with it, the echo a free worker is held for is back, and its batch may go now."""
        self.arrivals += 1
        if self.arrivals <= CYCLE_ARRIVALS:
            self._offsets.append(now - self.cycle_start)
        if not self.hold_until or now >= self.hold_until:
            # (none, or it ran out: the batch that leaves next ends it, `batch_left`). Clients not held
            # for (their echo comes back over more than `HOLD_WITHIN` of a batch) are still back whole when
            # every connection the batch answered has sent again: their batch goes then, not at the
            # linger's end.
            returning = self._returning
            if client is None or not returning or client not in returning:
                return False
            returning.discard(client)
            return not returning
        if not self._capped:  # the first to come: the hold ends with its linger (or the echo's spread) at the latest
            self._capped = True
            self.hold_until = min(self.hold_until, now + max(linger_s, self._stretch_s))
        awaited = self._awaited
        if client is not None:
            awaited.discard(client)
            client.missed = 0  # (back while a worker is held: waited for from now on)
        if (awaited or self._counted) and self.arrivals < self._cycle_size:
            return False  # (as many as it answered came: back too, whichever connections they came on)
        self.returned += 1
        self._end_hold(now)
        return True

    def batch_finished(self, now: float, answered: int, batch_s: float) -> None:
        """Score the cycle since the previous batch finished (`batch_s`: a batch's time), and start the
        next one."""
        length = now - self.cycle_start
        if self.cycle_start and self._cycle_size and length > 0:
            offsets = self._offsets  # (in the order they came: sorted)
            size = self._cycle_size
            late = len(offsets) - bisect.bisect_right(offsets, length / 2)
            early = bisect.bisect_right(offsets, length / 4)
            echoed = early >= size / 2 and early >= 2 * late  # (a quarter against a half: 4x as dense)
            if not echoed and size >= WHOLE_BURST:  # the whole echo back early, then nothing: see `WHOLE_WITHIN`
                whole = bisect.bisect_right(offsets, length * min(WHOLE_WITHIN, BY_CHANCE ** (1.0 / size)))
                if whole >= size and whole == len(offsets):
                    echoed, early = True, whole
            self.score += _ECHO_ALPHA * min(1.0, size / EVIDENCE) * (float(echoed) - self.score)
            if echoed:  # the burst's end: its last early arrival (a slow client's later one is not it)
                self.echo_s += _ECHO_ALPHA * (offsets[early - 1] - self.echo_s)
                if len(offsets) >= size:  # back whole: as many came as it answered
                    spread = _worth_waiting_s(offsets, size, batch_s)  # (rises at once, falls over ~20 cycles)
                    self.spread_s = spread if spread > self.spread_s else self.spread_s + _SPREAD_FALL * (spread - self.spread_s)
        self.cycle_start, self._cycle_size = now, answered
        self._returning.clear()  # (`hold` fills it where it holds no worker for clients too slow to hold for)
        self._offsets.clear()
        self.arrivals = 0

    @property
    def expected(self) -> bool:
        """Closed-loop clients echo the batches: a free worker is worth holding for them."""
        return self.score >= ECHO_SCORE_TO_HOLD

    def hold(self, answered: Sequence[Client | None], now: float, waiting: bool, longest_s: float) -> bool:
        """Whether a worker that frees having just answered requests on the `answered` connections (None:
        one not known) is held for their echo, for `longest_s` at most (a batch's time), and until the first of them to come lingered:
        when one is expected, comes back whole within `HOLD_WITHIN` of a batch's time (two groups held
        for merge into cycles of a batch and the echo, where they alternated in cycles of two batches: a
        gain while the echo takes less than a batch, and the margin for its variation; a slower client
        is the Python load generator's 100 against 10 ms batches, whose answers come back all through
        the cycle), and someone is to be waited for (not a connection found slow); a lone answer only
        beside requests `waiting` (a lone request goes at once anyway, and a light open loop's come in
        a cycle's first half now and then)."""
        if not self.expected or self.echo_s > HOLD_WITHIN * longest_s or (not waiting and len(answered) < 2):
            self._not_held_for(answered)
            return False
        awaited, counted = self._awaited, False
        awaited.clear()
        for client in answered:
            if client is None:
                counted = True  # (a request on no known connection: counted back, `arrivals`)
            elif not client.slow:
                awaited.add(client)
        if not awaited and not counted:
            self._not_held_for(answered)
            return False
        self._counted = counted
        self._held_at, self.hold_until, self._capped = now, now + longest_s, False
        self._stretch_s = min(SPREAD_MARGIN * self.spread_s, HOLD_WITHIN * longest_s)
        self.holds += 1
        return True

    def _not_held_for(self, answered: Sequence[Client | None]) -> None:
        """No worker is held for `answered`: their batch still goes once they are all back (`arrived`),
        where every one of them is known."""
        if len(answered) >= 2 and None not in answered:
            self._returning.update(client for client in answered if client is not None)  # (emptied by `batch_finished`)

    def batch_left(self, now: float) -> None:
        """A batch left: a hold still in force ends, and where it ran out, the connections it waited for
        in vain count the miss (two in a row: not waited for again, `Client.slow`)."""
        if not self.hold_until:
            return
        self.cut += 1
        if now >= self.hold_until:
            for client in self._awaited:
                client.missed += 1
                self.slow += client.missed == 2
        self._end_hold(now)

    def _end_hold(self, now: float) -> None:
        self.held_s += now - self._held_at
        self.hold_until = 0.0
        self._awaited.clear()


def _worth_waiting_s(offsets: Sequence[float], size: int, batch_s: float) -> float:
    """How long after its first arrival an echo of `size` requests (their `offsets` in a cycle, in the
    order they came) is worth waiting for: until its k-th arrival, where the k in wait from their
    arrival to it, and the rest a batch more each (left for the next one), wait the least in all. An
    echo spread evenly is waited for whole while it takes less than a batch; a few clients that think
    long are left for the next batch rather than waited for by all the others."""
    first = offsets[0]
    best_k, best, arrived_s = size, math.inf, 0.0  # (arrived_s: the sum of the first k's offsets)
    for k in range(1, size + 1):
        at = offsets[k - 1]
        arrived_s += at
        waited = k * at - arrived_s + (size - k) * batch_s
        if waited < best:
            best_k, best = k, waited
    return offsets[best_k - 1] - first


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
