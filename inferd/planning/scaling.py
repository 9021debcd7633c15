"""What every fleet, simulated (`fleet.Fleet`) or live (`live.LiveFleet`), shares with its autoscaler: the
samples Prometheus would scrape, read `lag_s` late, and the scaling to the autoscaler's answer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from .hpa import HpaSettings


@dataclass
class Sample:
    at: float
    ready: int
    utilisation: float  # summed over ready replicas: each one's busy share of the last interval
    waiting: int
    predicted_wait_s: float  # the largest over ready replicas
    arrival_rps: float
    arrived_total: float = 0.0  # requests arrived since the fleet started (inferd_requests_total, summed)


class _Clock(Protocol):
    @property
    def now(self) -> float: ...


class Scaling:
    """What a fleet, simulated (`Fleet`) or live (`live.LiveFleet`), does for its autoscaler: reads its
    samples as Prometheus had them `lag_s` ago, and scales to the autoscaler's answer, at most
    `max_replicas`, each replica added starting after `start_s`."""

    clock: _Clock
    samples: list[Sample]
    hpa_settings: HpaSettings | None
    start_s: float
    max_replicas: float = math.inf
    _replicas_over_time: list[tuple[float, int]]
    _scale_events: int

    def _count(self) -> int:
        """Replicas the Deployment holds: starting or ready, not removed."""
        raise NotImplementedError

    def _add(self, start_s: float) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError

    def _scale_to(self, desired: int) -> None:
        current = self._count()
        desired = int(min(desired, self.max_replicas))
        if desired == current:
            return
        self._scale_events += 1
        for _ in range(desired - current):
            self._add(self.start_s)
        for _ in range(current - desired):
            self._remove()
        self._replicas_over_time.append((self.clock.now, self._count()))

    def lagged(self) -> Sample | None:
        """The newest sample Prometheus would have had `lag_s` ago."""
        cutoff = self.clock.now - (self.hpa_settings.lag_s if self.hpa_settings is not None else 0.0)
        for sample in reversed(self.samples):
            if sample.at <= cutoff:
                return sample
        return None
