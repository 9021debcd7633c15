"""A fleet of simulated inferd replicas behind a load balancer, scaled by an autoscaler, on a virtual
clock (`inferd plan`).

Each replica is `replica.Replica`: the server's own batcher, cost model and admission. A request goes
to the ready replica with the fewest outstanding requests (HAProxy's `leastconn`); none ready: a 503.
Every `sample_s` the fleet records what a scrape would read (each replica's busy share since the last
sample, the requests waiting, the predicted wait, the requests arrived); the autoscaler (`hpa.Hpa`,
Kubernetes' algorithm) syncs every `poll_s` on the samples as its Prometheus had them, the newest `lag_s`
old (a rate query reads its scrapes among them: `policies`). A replica added starts after `start_s` (weights,
warm-up, graph capture), counted as a GPU from the moment it is asked for; one removed takes no new
requests and leaves once it has answered what it holds. GPU-hours count every replica from its start
to its removal.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from ..config import ModelConfig, TierConfig
from ..messages import PendingRequest, RequestState
from .hpa import Hpa, HpaSettings
from .replica import Device, Outcome, Replica, VirtualClock
from .scaling import Sample, Scaling


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a run, and after it as it was before. Why: a day keeps an outcome per
    request (16.2 M), and each full collection walks every one of them; the collector took ~6% of a
    3,600 s day, a share growing with the day. Next to nothing a run makes is cyclic (~13 objects per
    thousand requests, measured), and reference counting frees the rest as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# A policy's metrics, from the fleet's recent samples: name -> value (what its triggers read).
Signals = Callable[["Fleet"], dict[str, float]]


@dataclass
class FleetSettings:
    start_s: float = 60.0
    sample_s: float = 2.5  # (finer than any scrape: a policy's scrapes and lag fall on its samples)
    initial_replicas: int = 1


@dataclass
class FleetResult:
    outcomes: list[Outcome]
    replica_s: float  # GPU-seconds
    samples: list[Sample]
    replicas_over_time: list[tuple[float, int]]  # (when, replicas counted: starting and ready)
    scale_events: int

    def summary(self) -> dict[str, Any]:
        n = len(self.outcomes) or 1
        summary: dict[str, Any] = {"requests": len(self.outcomes),
                                   "within_slo": round(sum(1 for o in self.outcomes if o.in_slo) / n, 5),
                                   "refused": round(sum(1 for o in self.outcomes if o.refused) / n, 5),
                                   "gpu_hours": round(self.replica_s / 3600.0, 3),
                                   "peak_replicas": max((r for _, r in self.replicas_over_time), default=0),
                                   "scale_events": self.scale_events}
        tiers = sorted({o.tier for o in self.outcomes})
        if tiers != ["default"] and tiers:
            summary["by_tier"] = {tier: _attainment([o for o in self.outcomes if o.tier == tier]) for tier in tiers}
        return summary


def _attainment(outcomes: list[Outcome]) -> dict[str, Any]:
    n = len(outcomes) or 1
    return {"requests": len(outcomes), "within_slo": round(sum(1 for o in outcomes if o.in_slo) / n, 5),
            "refused": round(sum(1 for o in outcomes if o.refused) / n, 5)}


class _SimReplica:
    """A replica's life in the fleet: asked for (`started`), ready, removed."""

    __slots__ = ("replica", "name", "started", "ready_at", "removed", "busy_at_sample")

    def __init__(self, replica: Replica, started: float, ready_at: float) -> None:
        self.replica, self.name, self.started, self.ready_at = replica, replica.name, started, ready_at
        self.removed: float | None = None
        self.busy_at_sample = 0.0


_TAKEN = RequestState.TAKEN
_outstanding = operator.attrgetter("outstanding")  # (leastconn's key, in C: asked over every ready replica)


class Fleet(Scaling):
    """The simulation (see the module docstring)."""

    clock: VirtualClock

    def __init__(self, config: ModelConfig, device: Device, hpa: HpaSettings | None, signals: Signals | None,
                 settings: FleetSettings | None = None, buckets: int = 2,
                 tiers: tuple[TierConfig, ...] = (TierConfig("default"),)) -> None:
        self.config = config
        self.device = device
        self.settings = settings or FleetSettings()
        self.start_s = self.settings.start_s
        self.clock = VirtualClock()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        # Each admitted request's deadline, in the order they were set, which is the order they fall due
        # (arrival plus the one timeout): a queue beside the heap, which held a day's 16 M of them.
        self._deadlines: deque[tuple[float, int, Replica, PendingRequest]] = deque()
        self._seq = itertools.count()
        self._buckets = buckets
        self._tiers = tiers  # (highest priority first, as the config's parser orders them)
        self._replicas: list[_SimReplica] = []
        # The ready replicas, kept between the moments that change them (a replica added, ready, removed):
        # asked per request, and a day's fleet asks for tens of replicas ever.
        self._ready: list[_SimReplica] = []
        self._serving: list[Replica] = []  # their replicas, in the same order: what leastconn picks among
        self._ready_until = math.inf  # when the next starting replica becomes ready
        self._names = itertools.count()
        self.hpa = Hpa(hpa) if hpa is not None else None
        self.hpa_settings = hpa
        self.signals = signals
        self.samples: list[Sample] = []  # what a scrape would have read, every `sample_s`, oldest first
        self._arrived_since_sample = 0
        self._arrived_total = 0
        self._replicas_over_time: list[tuple[float, int]] = []
        self._scale_events = 0
        self.fixed: Callable[[float], int] | None = None  # an oracle's replicas by time, instead of the autoscaler
        self.fixed_step_s = 10.0  # ...asked this often

    def schedule(self, when: float, what: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), what))

    # ---- replicas --------------------------------------------------------------------------------

    @property
    def replicas(self) -> list[_SimReplica]:
        """Every replica the run asked for, removed ones included."""
        return list(self._replicas)

    @property
    def counted(self) -> list[_SimReplica]:
        """Replicas the Deployment holds: starting or ready, not removed."""
        return [r for r in self._replicas if r.removed is None]

    @property
    def ready(self) -> list[_SimReplica]:
        if self.clock.now >= self._ready_until:
            self._refresh_ready()
        return self._ready

    def _refresh_ready(self) -> None:
        now = self.clock.now
        counted = self.counted
        self._ready = [r for r in counted if r.ready_at <= now]
        self._serving = [r.replica for r in self._ready]
        self._ready_until = min((r.ready_at for r in counted if r.ready_at > now), default=math.inf)

    def _add(self, start_s: float) -> None:
        now = self.clock.now
        replica = Replica(f"r{next(self._names)}", self.config, self.device, self.clock, self.schedule, tiers=self._tiers,
                          buckets=self._buckets)
        self._replicas.append(_SimReplica(replica, now, now + start_s))
        self._refresh_ready()

    def _remove(self) -> None:
        """The newest replica goes first (starting ones before ready ones), as a ReplicaSet picks."""
        victim = max(self.counted, key=lambda r: r.started)
        victim.removed = self.clock.now
        self._refresh_ready()

    def _count(self) -> int:
        return len(self.counted)

    # ---- the run ---------------------------------------------------------------------------------

    def run(self, arrivals: Iterable[tuple[float, int, str]], until_s: float, slo_s: float) -> FleetResult:
        """Every arrival, (at, bucket, tier) each (an `Arrival`, or a tuple as `traces.drawn_beside` hands
        them over), offered as it comes; then what was admitted last is answered or expires."""
        for _ in range(self.settings.initial_replicas):
            self._add(0.0)
        self._replicas_over_time.append((0.0, len(self.counted)))
        self.schedule(self.settings.sample_s, self._sample)
        if self.hpa_settings is not None:
            self.schedule(self.hpa_settings.poll_s, self._sync)
        if self.fixed is not None:
            self.schedule(0.0, self._follow_fixed)
        outcomes: list[Outcome] = []
        timeout_s = self.config.timeout_ms / 1000.0
        slo_due = self.config.slo_ms / 1000.0 if self.config.slo_ms else None
        # each tier's objective, as a server's intake sets it (the tighter of its own and the model's)
        slo_of = {t.name: self._replicas[0].replica.timeliness.slo_s(t.name) for t in self._tiers} if self._replicas else {}
        clock = self.clock
        run_until = self._run_until
        with collector_paused():
            for number, (at, bucket, tier) in enumerate(arrivals):
                run_until(at)
                clock.now = at
                tier_slo = slo_of.get(tier, slo_due)
                outcome = Outcome(at, slo_s if tier_slo is None or tier_slo == slo_due else tier_slo, tier)
                outcomes.append(outcome)
                self._arrived_since_sample += 1
                self._arrived_total += 1
                self._offer(number, bucket, tier, outcome, timeout_s, tier_slo)
            run_until(max(until_s, clock.now + timeout_s + 1.0))  # (what was admitted last is answered or expires)
        # GPU time over the day itself, every replica from its ask to its removal (or the day's end)
        replica_s = sum(min(until_s, r.removed if r.removed is not None else until_s) - r.started
                        for r in self._replicas if r.started < until_s)
        return FleetResult(outcomes, replica_s, self.samples, self._replicas_over_time, self._scale_events)

    def _run_until(self, until: float) -> None:
        """Every event due by `until`, in the order of (when, when it was scheduled): the heap's and the
        deadlines' queue's, merged."""
        events, deadlines, clock = self._events, self._deadlines, self.clock
        while True:
            if deadlines:
                first = deadlines[0]
                at = first[0]
                if at <= until and (not events or at < events[0][0] or (at == events[0][0] and first[1] < events[0][1])):
                    deadlines.popleft()
                    if first[3].state is not _TAKEN:  # (most were taken into a batch: nothing to expire)
                        clock.now = max(clock.now, at)
                        first[2].expire(first[3])
                    continue
            if not events or events[0][0] > until:
                return
            when, _, what = heapq.heappop(events)
            clock.now = max(clock.now, when)
            what()

    def _offer(self, number: int, bucket: int, tier: str, outcome: Outcome, timeout_s: float, slo_due: float | None) -> None:
        if not self.ready:
            outcome.refused = True
            return
        target = min(self._serving, key=_outstanding)
        now = self.clock.now
        deadline = now + timeout_s
        due = deadline if slo_due is None else min(deadline, now + slo_due)
        # (due and slo_at by position: a keyword costs more than the rest of the request's making)
        request = PendingRequest(f"q{number}", None, now, deadline, cast(Any, None), due,
                                 None if slo_due is None else now + slo_due, tier=tier, bucket=bucket)
        if target.offer(request, outcome):
            self._deadlines.append((deadline, next(self._seq), target, request))

    def _sample(self) -> None:
        now = self.clock.now
        interval = self.settings.sample_s
        ready = self.ready
        utilisation = 0.0
        for r in ready:
            replica = r.replica
            busy = replica.stats.busy_s
            running = replica.worker.current
            if running is not None:
                busy += now - running.started_at
            utilisation += min(1.0, max(0.0, busy - r.busy_at_sample) / interval)
            r.busy_at_sample = busy
        sample = Sample(now, len(ready), utilisation, sum(r.replica.depth for r in ready),
                        max((r.replica.predicted_wait_s() for r in ready), default=0.0),
                        self._arrived_since_sample / interval, self._arrived_total)
        self._arrived_since_sample = 0
        self.samples.append(sample)
        self.schedule(now + interval, self._sample)

    def _sync(self) -> None:
        assert self.hpa is not None and self.hpa_settings is not None and self.signals is not None
        metrics = self.signals(self)
        current = len(self.counted)
        desired = self.hpa.desired(self.clock.now, current, metrics)
        self._scale_to(desired)
        self.schedule(self.clock.now + self.hpa_settings.poll_s, self._sync)

    def _follow_fixed(self) -> None:
        assert self.fixed is not None
        self._scale_to(self.fixed(self.clock.now))
        self.schedule(self.clock.now + self.fixed_step_s, self._follow_fixed)
