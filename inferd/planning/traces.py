"""Synthetic traffic for the fleet simulator: a day of diurnal load with sudden spikes, inputs of two
length buckets (the mix that fragments batches), each request's arrival time drawn as Poisson
arrivals of the rate at that moment."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
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
        base = self.trough_rps + (self.peak_rps - self.trough_rps) * (1.0 - math.cos(2.0 * math.pi * t / self.day_s)) / 2.0
        boost = 1.0
        for share in self.spikes:
            start = share * self.day_s
            if start <= t < start + self.spike_ramp_s + self.spike_s:
                boost = max(boost, 1.0 + (self.spike_factor - 1.0) * min(1.0, (t - start) / self.spike_ramp_s))
        return base * boost

    def arrivals(self, until_s: float | None = None) -> Iterator[Arrival]:
        """Poisson arrivals of the rate at each moment (thinning against the day's highest rate)."""
        rng = random.Random(self.seed)
        top = self.peak_rps * self.spike_factor
        end = self.day_s if until_s is None else min(until_s, self.day_s)
        t = 0.0
        while True:
            t += rng.expovariate(top)
            if t >= end:
                return
            if rng.random() * top <= self.rate(t):
                bucket = 1 if rng.random() < self.long_share else 0
                yield Arrival(t, bucket, self._tier(rng.random()) if self.tiers else "default")

    def _tier(self, draw: float) -> str:
        for name, share in self.tiers:
            if draw < share:
                return name
            draw -= share
        return self.tiers[-1][0]
