"""Synthetic traffic for the fleet simulator: a day of diurnal load with sudden spikes, inputs of two
length buckets (the mix that fragments batches), each request's arrival time drawn as Poisson
arrivals of the rate at that moment."""

from __future__ import annotations

import math
import multiprocessing
import queue
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from multiprocessing.queues import Queue
from typing import NamedTuple

BOUND_STEP_S = 10.0  # the rate's bounds in thinning hold over steps of this
BOUND_SLACK = 1e-9  # ...each loosened by this share (the rate's own rounding stays inside them)
CHUNK = 1 << 16  # arrivals drawn beside the fleet (`drawn_beside`) travel in chunks of this many...
CHUNKS_AHEAD = 4  # ...at most this many ahead of it


class Arrival(NamedTuple):
    """One request of a trace: when it arrives, its length bucket, its tier. (A tuple: a day makes 16 M,
    and a frozen dataclass takes twice as long to make.)"""

    at: float
    bucket: int
    tier: str = "default"


@dataclass(frozen=True)
class DayTrace:
    """A day of `day_s` seconds (time-compressed where a real day is too many requests to simulate): the
    rate goes from `trough_rps` (at 0 and `day_s`) to `peak_rps` (at the middle) as a cosine; each of
    `spikes` (start times, as shares of the day) multiplies it by `spike_factor` after a ramp of
    `spike_ramp_s`, for `spike_s`; `long_share` of the inputs are of the long bucket (1); `tiers`: each
    tier's share of the requests (none: every request of the tier "default")."""

    day_s: float = 4 * 3600.0
    trough_rps: float = 40.0
    peak_rps: float = 320.0
    spikes: tuple[float, ...] = (0.3, 0.55, 0.8)
    spike_factor: float = 4.0
    spike_ramp_s: float = 60.0
    spike_s: float = 300.0
    long_share: float = 0.1
    seed: int = 7
    tiers: tuple[tuple[str, float], ...] = ()  # ((name, share), ...): shares summing to 1

    def rate(self, t: float) -> float:
        base = self._base(t)
        boost = 1.0
        for share in self.spikes:
            start = share * self.day_s
            if start <= t < start + self.spike_ramp_s + self.spike_s:
                boost = max(boost, 1.0 + (self.spike_factor - 1.0) * min(1.0, (t - start) / self.spike_ramp_s))
        return base * boost

    def arrivals(self, until_s: float | None = None) -> Iterator[Arrival]:
        """Poisson arrivals of the rate at each moment (thinning against the day's highest rate). A
        candidate is kept where a uniform draw times that rate is at most the rate at its moment; bounds
        of the rate over each `BOUND_STEP_S` decide most candidates without computing the rate (a whole
        day draws ~110 M of them for 16 M arrivals), and the draws and the decisions are the same."""
        rng = random.Random(self.seed)
        uniform, log = rng.random, math.log
        top = self.peak_rps * self.spike_factor
        end = self.day_s if until_s is None else min(until_s, self.day_s)
        t = 0.0
        low = high = 0.0
        bounded_until = -1.0  # the bounds hold up to here
        while True:
            t += -log(1.0 - uniform()) / top  # (rng.expovariate(top), as it computes it, without the call)
            if t >= end:
                return
            if t >= bounded_until:
                low, high, bounded_until = self._bounds(t)
            draw = uniform() * top
            if draw <= low or (draw <= high and draw <= self.rate(t)):
                bucket = 1 if uniform() < self.long_share else 0
                yield Arrival(t, bucket, self._tier(uniform()) if self.tiers else "default")

    def _bounds(self, t: float) -> tuple[float, float, float]:
        """Of the rate over [start, start + BOUND_STEP_S) around `t`: a floor and a ceiling, each a hair
        looser than the arithmetic (a candidate between them is decided by the rate itself), and the
        step's end. The diurnal part is monotone on each half-day, so its ends bound it (the middle
        where a step holds it); the spikes only raise it, up to `spike_factor`."""
        start = math.floor(t / BOUND_STEP_S) * BOUND_STEP_S
        stop = start + BOUND_STEP_S
        ends = (self._base(start), self._base(stop))
        low, high = min(ends), max(ends)
        if start < self.day_s / 2 < stop:
            high = self.peak_rps
        if any(start < share * self.day_s + self.spike_ramp_s + self.spike_s and share * self.day_s < stop
               for share in self.spikes):
            high *= max(1.0, self.spike_factor)
        return low * (1.0 - BOUND_SLACK), high * (1.0 + BOUND_SLACK), stop

    def _base(self, t: float) -> float:
        """The diurnal rate at `t`, without the spikes."""
        return self.trough_rps + (self.peak_rps - self.trough_rps) * (1.0 - math.cos(2.0 * math.pi * t / self.day_s)) / 2.0

    def _tier(self, draw: float) -> str:
        for name, share in self.tiers:
            if draw < share:
                return name
            draw -= share
        return self.tiers[-1][0]


Chunk = tuple[bytes, bytes, list[str] | None]  # (arrival times as doubles, buckets, tiers or None: all "default")


def drawn_beside(trace: DayTrace, chunk: int = CHUNK) -> Iterator[tuple[float, int, str]]:
    """`trace.arrivals()`, (at, bucket, tier) each, drawn in a process of its own a few chunks ahead of
    the reader. Why: the draws are a tenth of a simulated day's time (thinning draws ~7 candidates an
    arrival), which a second core takes off the fleet's loop; handed over as arrays, an arrival costs
    that loop only its unpacking. The same arrivals, to the bit."""
    context = multiprocessing.get_context("spawn")  # (not forked: see `plan.plan`)
    chunks: Queue[Chunk | None] = context.Queue(maxsize=CHUNKS_AHEAD)
    drawer = context.Process(target=_draw_into, args=(trace, chunks, chunk), name="inferd-trace", daemon=True)
    drawer.start()
    complete = False  # every arrival read: the drawer is exiting on its own
    try:
        while True:
            try:
                drawn = chunks.get(timeout=1.0)
            except queue.Empty:
                if drawer.is_alive():
                    continue
                raise RuntimeError(f"the process drawing the trace's arrivals ended early (exit code {drawer.exitcode})") from None
            if drawn is None:
                complete = True
                return
            times, buckets, tiers = drawn
            ats = array("d")
            ats.frombytes(times)
            yield from zip(ats, buckets, tiers if tiers is not None else repeat("default", len(ats)))
    finally:
        if not complete and drawer.is_alive():  # (the reader stopped early, or was interrupted)
            drawer.terminate()
        drawer.join()
        chunks.close()


def _draw_into(trace: DayTrace, chunks: Queue[Chunk | None], chunk: int) -> None:
    times, buckets, tiers = array("d"), bytearray(), []
    tiered = bool(trace.tiers)
    for at, bucket, tier in trace.arrivals():
        times.append(at)
        buckets.append(bucket)
        if tiered:
            tiers.append(tier)
        if len(times) == chunk:
            chunks.put((times.tobytes(), bytes(buckets), tiers if tiered else None))
            times, buckets, tiers = array("d"), bytearray(), []
    if times:
        chunks.put((times.tobytes(), bytes(buckets), tiers if tiered else None))
    chunks.put(None)
