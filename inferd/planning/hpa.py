"""Kubernetes' Horizontal Pod Autoscaler, as its documentation states the algorithm, on a virtual clock.

Each sync (KEDA polls every `poll_s`), with each trigger's metric as Prometheus had it `lag_s` ago:
- per trigger, as the HPA treats an external metric: for an average-value target, ceil(metric /
  target) replicas; for a value target, ceil(current x metric / target); the current count while the
  usage ratio is within `tolerance` of 1; the largest of the triggers' counts is the recommendation;
- stabilisation: scaling down takes the highest recommendation of the last `down_window_s` (default
  300 s), scaling up the lowest of the last `up_window_s` (default 0: the newest);
- rate limits (the default behaviour): up by at most max(100% of current, 4 pods) per 15 s, down by at
  most 100% per 15 s;
- bounded by `min_replicas` and `max_replicas`.
Replicas that are starting count as current (the HPA counts the Deployment's replicas); the metric
comes from the ready ones only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Trigger:
    """One metric the autoscaler follows, and its target."""

    metric: str
    target: float
    average: bool = True  # AverageValue (the metric per ready replica) rather than Value (the metric as a whole)


@dataclass(frozen=True)
class HpaSettings:
    """One autoscaler's settings, as an operator writes them in a HorizontalPodAutoscaler / ScaledObject."""

    triggers: tuple[Trigger, ...]
    tolerance: float = 0.1
    min_replicas: int = 1
    max_replicas: int = 100
    up_window_s: float = 0.0
    down_window_s: float = 300.0
    poll_s: float = 30.0  # KEDA's pollingInterval
    lag_s: float = 15.0  # how old the newest scrape is when KEDA asks (a rate query reads its window behind it)
    up_pods: int = 4  # the default scale-up policies: the larger of 4 pods and 100% per 15 s
    up_percent: float = 100.0
    down_percent: float = 100.0
    period_s: float = 15.0


class Hpa:
    """The autoscaler's state: its recommendations and recent scale events (for the rate limits)."""

    def __init__(self, settings: HpaSettings) -> None:
        self.settings = settings
        self._recommendations: deque[tuple[float, int]] = deque()
        self._changes: deque[tuple[float, int]] = deque()  # (when, by how many) of each change

    def desired(self, now: float, current: int, metrics: dict[str, float]) -> int:
        """The replicas to run after this sync, given the `current` replicas (the Deployment's, starting
        ones included) and each trigger's metric value (a metric missing reads 0)."""
        s = self.settings
        raw = max(self._for_trigger(trigger, current, metrics.get(trigger.metric, 0.0)) for trigger in s.triggers)
        raw = min(s.max_replicas, max(s.min_replicas, raw))
        self._recommendations.append((now, raw))
        while self._recommendations and self._recommendations[0][0] < now - max(s.up_window_s, s.down_window_s):
            self._recommendations.popleft()
        if raw < current:  # down: the highest recommendation of its window, never above current
            desired = min(current, max(r for t, r in self._recommendations if t >= now - s.down_window_s))
        elif raw > current:  # up: the lowest of its window, never below current
            desired = max(current, min(r for t, r in self._recommendations if t >= now - s.up_window_s))
        else:
            desired = current
        desired = self._rate_limited(now, current, desired)
        if desired != current:
            self._changes.append((now, desired - current))
        return desired

    def _for_trigger(self, trigger: Trigger, current: int, metric: float) -> int:
        """One trigger's count, as the HPA computes an external metric's: an average-value target wants
        ceil(metric / target) replicas, a value target ceil(current x metric / target); none changes
        while the usage ratio is within the tolerance of 1."""
        if trigger.target <= 0:
            return current
        if trigger.average:
            ratio = metric / (trigger.target * max(1, current))
            return current if abs(ratio - 1.0) <= self.settings.tolerance else math.ceil(metric / trigger.target)
        ratio = metric / trigger.target
        return current if abs(ratio - 1.0) <= self.settings.tolerance else math.ceil(ratio * max(1, current))

    def _rate_limited(self, now: float, current: int, desired: int) -> int:
        """The default policies, per `period_s`: up to max(start + up_pods, start x (1 + up_percent)), down
        to start x (1 - down_percent), `start` being the replicas at the period's start (the changes made
        within it undone)."""
        s = self.settings
        while self._changes and self._changes[0][0] <= now - s.period_s:
            self._changes.popleft()
        if desired > current:
            start = current - sum(d for _, d in self._changes if d > 0)
            return min(desired, max(start + s.up_pods, math.ceil(start * (1 + s.up_percent / 100.0))))
        if desired < current:
            start = current - sum(d for _, d in self._changes if d < 0)
            return max(desired, math.ceil(start * (1 - s.down_percent / 100.0)))
        return desired
