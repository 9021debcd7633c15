"""A short live fleet against the simulator (issue 53): real `inferd serve` processes (the simulated GPU)
behind HAProxy, scaled by the demand policy's HPA arithmetic on their /metrics, over a minute
of traffic that rises from 30 to 220 requests/s and falls back (one replica serves ~115 within the
objective), and 40 s of quiet after it; the simulator, fed the same arrivals with the same policy,
start-up and windows, says what the fleet should have done. The rate is read over a 30 s window at 0.7
of capacity (the ScaledObject before irate): the shipped irate reads the last two scrapes only, and on this
two-core host beside the rest of the suite the live fleet once kept 7 points fewer within the objective than
the simulator with it (slowed replicas refusing more), past what this test allows."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from inferd.planning.fleet import Fleet, FleetSettings
from inferd.planning.live import LiveFleet, LiveSettings
from inferd.planning.plan import PlanSettings, capacity_at_objective
from inferd.planning.policies import demand_policy
from inferd.planning.traces import DayTrace

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (Debian package 'haproxy')")

MODEL = PlanSettings(long_factor=1.0)  # 100 ms + 2 ms an input, batches of 16, a 1 s objective, 2 s deadlines
UNTIL_S = 100.0  # (the quiet after the day: the replicas the load no longer needs are let go)
DAY = DayTrace(day_s=60.0, trough_rps=30.0, peak_rps=220.0, spikes=(), long_share=0.0)


async def test_a_live_fleet_scales_as_the_simulator_says_and_loses_nothing(tmp_path):
    capacity = capacity_at_objective(MODEL, DAY, seconds=60.0)
    policy = demand_policy(capacity, 0.7, window_s=30.0, scrape_s=15.0)
    policy = replace(policy, hpa=replace(policy.hpa, lag_s=2.0, down_window_s=20.0, max_replicas=4))  # (a short day's)
    arrivals = list(DAY.arrivals())
    settings = LiveSettings(model=MODEL, start_s=10.0, sample_s=2.0, max_replicas=4)
    async with LiveFleet(settings, policy, tmp_path) as fleet:
        live = await fleet.run(arrivals, UNTIL_S, MODEL.slo_ms / 1000.0)
    simulated = Fleet(MODEL.config(), MODEL.device(), policy.hpa, policy.signals,
                      FleetSettings(start_s=10.0, sample_s=2.0), buckets=1).run(iter(arrivals), UNTIL_S, MODEL.slo_ms / 1000.0)

    assert len(live.outcomes) == len(arrivals)
    assert fleet.failures == []  # every request answered or refused (503), none lost: scaling up or down
    assert all(o.done is not None or o.refused for o in live.outcomes)
    counts = [n for _, n in live.replicas_over_time]
    assert max(counts) >= 3 and counts[-1] < max(counts), live.replicas_over_time  # up with the load, and down
    assert all(r.process.poll() is not None for r in fleet._replicas)  # (each one stopped has exited)

    # the simulator's account of the same 100 s, within what a loaded two-core host allows
    # (the benchmark's ten-minute day holds them to 1 point and 10%: benchmarks/results/autoscaling_live.md)
    assert abs(live.summary()["within_slo"] - simulated.summary()["within_slo"]) < 0.04, (live.summary(), simulated.summary())
    assert abs(live.replica_s - simulated.replica_s) <= 0.15 * simulated.replica_s, (live.replicas_over_time,
                                                                                      simulated.replicas_over_time)
