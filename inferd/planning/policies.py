"""The scaling policies the simulator compares, each as an operator would configure it (KEDA triggers on
Prometheus queries, the HPA's behaviour), and the oracle they are measured against.

- `utilisation`: GPU utilisation, the HPA default people reach for (the busy share of each replica's
  worker, 70% a replica), KEDA polling every 15 s;
- `waiting`: requests waiting per replica (50);
- `predicted_wait`: deploy/k8s/keda-scaledobject.yaml as it shipped before `shipped`: the largest
  predicted wait over 0.2 s (a Value trigger) and 200 waiting requests per replica, polled every 5 s,
  300 s down-stabilisation;
- `objective`: the same with the predicted wait's threshold at half the latency objective (under an
  objective a partial batch lingers for most of it, so a fixed 0.2 s reads "late" at any load);
- `ahead`: `objective`'s triggers plus one that adds replicas ahead of need by the start delay: the
  arrival rate extrapolated `start_s` ahead from its trend over the last two minutes, against 80% of a
  replica's measured capacity;
- `rate`: only the arrival rate's trend a start-up ahead against 80% of a replica's capacity, with the
  waiting requests per replica as a net (the signals that fall as replicas are added).
- `shipped`: deploy/k8s/keda-scaledobject.yaml as it ships: the request rate (refused requests
  included: `irate(inferd_requests_total[1m])`, scraped every 5 s) per replica against `demand_target`
  of a replica's capacity at the objective (what `inferd plan` calibrates), polled every 5 s, 120 s
  down-stabilisation (`demand_policy` reads other queries and scrapes): a signal that falls as
  replicas are added, reads above target however far overloaded (utilisation stops at 100%), and asks
  for the replicas the rate needs in one step.
- the oracle: the fewest replicas that keep up with the trace's own rate at each minute (its highest
  rate within the minute over a replica's capacity at the objective), each started in time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .fleet import Fleet, Signals
from .hpa import HpaSettings, Trigger

SHIPPED_TARGET = 0.82  # the ScaledObject's threshold, as a share of a replica's capacity within the objective


@dataclass(frozen=True)
class Policy:
    name: str
    hpa: HpaSettings
    signals: Signals


def _latest(fleet: Fleet) -> dict[str, float]:
    sample = fleet.lagged()
    if sample is None:
        return {}
    return {"utilisation": sample.utilisation, "waiting": float(sample.waiting), "predicted_wait": sample.predicted_wait_s}


def _ahead(fleet: Fleet, start_s: float, window_s: float = 120.0) -> dict[str, float]:
    """The current signals, and the arrival rate `start_s` ahead by its least-squares trend."""
    metrics = _latest(fleet)
    sample = fleet.lagged()
    if sample is None:
        return metrics
    recent = []
    for s in reversed(fleet.samples):  # (newest first: only the window's are read)
        if s.at < sample.at - window_s:
            break
        if s.at <= sample.at:
            recent.append((s.at, s.arrival_rps))
    if len(recent) >= 3:
        n = len(recent)
        mean_t = sum(t for t, _ in recent) / n
        mean_r = sum(r for _, r in recent) / n
        spread = sum((t - mean_t) ** 2 for t, _ in recent) or 1.0
        slope = sum((t - mean_t) * (r - mean_r) for t, r in recent) / spread
        metrics["rate_ahead"] = max(0.0, mean_r + slope * (fleet.clock.now - mean_t + start_s))
    return metrics


def _demand(fleet: Fleet, window_s: float = 30.0, scrape_s: float = 15.0, last_two: bool = False) -> dict[str, float]:
    """`rate(inferd_requests_total[window_s])` as Prometheus answers KEDA: of its scrapes, `scrape_s` apart
    and the newest the policy's `lag_s` old, those within the window's `window_s` up to now; the increase
    from the first of them to the last over the time between them (what rate() extrapolates to the
    window's edges is that rate). With fewer than two in the window it answers nothing (read as 0), as a
    window shorter than two scrapes does. `last_two`: `irate`, the rate between the window's last two."""
    newest = fleet.lagged()
    if newest is None:
        return {}
    opens, first, due = fleet.clock.now - window_s, newest, newest.at - scrape_s
    for s in reversed(fleet.samples):  # (newest first: only the window's are read)
        if s.at <= opens:
            break
        if s.at <= due + 1e-9:  # (the sample taken at the scrape, or the last before it on a live fleet)
            first, due = s, s.at - scrape_s
            if last_two:
                break
    if first is newest:
        return {}
    return {"demand": (newest.arrived_total - first.arrived_total) / (newest.at - first.at)}


def demand_policy(replica_capacity_rps: float, target: float, name: str = "shipped", window_s: float = 30.0,
                  scrape_s: float = 15.0, last_two: bool = False, down_window_s: float = 300.0) -> Policy:
    """Scale on the request rate, `target` of a replica's capacity each (deploy/k8s/keda-scaledobject.yaml):
    Prometheus scraping every `scrape_s` (the newest scrape half of that old when KEDA asks, on average),
    the rate read over `window_s` (`last_two`: irate's, between the window's last two scrapes), scaling
    down on the highest recommendation of `down_window_s`."""
    hpa = HpaSettings((Trigger("demand", target * replica_capacity_rps),), poll_s=5.0, lag_s=scrape_s / 2,
                      down_window_s=down_window_s)
    return Policy(name, hpa, lambda fleet: _demand(fleet, window_s, scrape_s, last_two))


def shipped_policy(replica_capacity_rps: float, target: float = SHIPPED_TARGET, name: str = "shipped") -> Policy:
    """deploy/k8s/keda-scaledobject.yaml: `irate(inferd_requests_total[1m])` on a 5 s scrape
    (deploy/prometheus/prometheus-k8s.yml's) against `target` of a replica's capacity, polled every 5 s,
    scaling down on the highest recommendation of 120 s."""
    return demand_policy(replica_capacity_rps, target, name, window_s=60.0, scrape_s=5.0, last_two=True, down_window_s=120.0)


def policies(replica_capacity_rps: float, start_s: float, slo_s: float, demand_target: float = SHIPPED_TARGET) -> list[Policy]:
    predicted_wait = (Trigger("predicted_wait", 0.2, average=False), Trigger("waiting", 200.0))
    objective = (Trigger("predicted_wait", 0.5 * slo_s, average=False), Trigger("waiting", 200.0))
    return [
        Policy("utilisation", HpaSettings((Trigger("utilisation", 0.7),), poll_s=15.0), _latest),
        Policy("waiting", HpaSettings((Trigger("waiting", 50.0),), poll_s=15.0), _latest),
        Policy("predicted_wait", HpaSettings(predicted_wait, poll_s=5.0), _latest),
        Policy("objective", HpaSettings(objective, poll_s=5.0), _latest),
        Policy("ahead", HpaSettings((*objective, Trigger("rate_ahead", 0.8 * replica_capacity_rps)), poll_s=5.0),
               lambda fleet: _ahead(fleet, start_s)),
        Policy("rate", HpaSettings((Trigger("rate_ahead", 0.8 * replica_capacity_rps), Trigger("waiting", 200.0)), poll_s=5.0),
               lambda fleet: _ahead(fleet, start_s)),
        shipped_policy(replica_capacity_rps, demand_target),
    ]


def oracle_replicas(rate: Callable[[float], float], capacity_rps: float, day_s: float, start_s: float,
                    step_s: float = 60.0) -> Callable[[float], int]:
    """Replicas by time: each minute's need (its highest rate, sampled every second, over `capacity_rps`),
    asked for `start_s` ahead so that they are ready when the minute begins."""
    needs = []
    for minute in range(int(math.ceil(day_s / step_s)) + 1):
        top = max(rate(minute * step_s + k) for k in range(int(step_s)))
        needs.append(max(1, math.ceil(top / capacity_rps)))

    def replicas(t: float) -> int:
        now_minute = int(t // step_s)
        ahead_minute = int((t + start_s) // step_s)
        return max(needs[min(m, len(needs) - 1)] for m in range(now_minute, ahead_minute + 1))

    return replicas


def present_replicas(rate: Callable[[float], float], capacity_rps: float, headroom: float = 1.0) -> Callable[[float], int]:
    """Replicas by time for the rate of that very moment, times `headroom`: what a scaler that knew the
    present exactly (no scrape, rate window, polling or stabilisation) would ask for, each replica ready a
    start later, removed at once when the rate falls. Not a policy anyone can run: the bound on what any
    signal read from the fleet can keep, beside the oracle, which asks a start ahead."""
    return lambda t: max(1, math.ceil(headroom * rate(t) / capacity_rps))
