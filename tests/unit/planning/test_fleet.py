"""The fleet simulator on short traces: every request ends once (answered, refused or expired), a replica
serves within its objective below its capacity and refuses (not queues to miss) above it, an autoscaler
adds replicas that take traffic only once started, and GPU time counts from the ask."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest

from inferd.planning.fleet import Fleet, FleetSettings, collector_paused
from inferd.planning.hpa import HpaSettings, Trigger
from inferd.planning.plan import PlanSettings
from inferd.planning.policies import oracle_replicas, policies
from inferd.planning.replica import SimDevice
from inferd.planning.traces import DayTrace

SETTINGS = PlanSettings(latency_ms=50.0, per_item_ms=0.0, long_factor=1.0, max_batch_size=8, slo_ms=400.0)
CAPACITY = 8 / 0.05  # 160 req/s: full batches of 8 every 50 ms


def steady(rate: float, seconds: float = 30.0, long_share: float = 0.0) -> DayTrace:
    return DayTrace(day_s=seconds, trough_rps=rate, peak_rps=rate, spikes=(), long_share=long_share)


def run(trace: DayTrace, policy=None, start_s: float = 0.0, initial: int = 1):  # type: ignore[no-untyped-def]
    fleet = Fleet(SETTINGS.config(), SETTINGS.device(), policy.hpa if policy else None, policy.signals if policy else None,
                  FleetSettings(start_s=start_s, initial_replicas=initial))
    return fleet.run(trace.arrivals(), trace.day_s, SETTINGS.slo_ms / 1000.0)


def test_below_capacity_every_request_is_answered_within_the_objective():
    result = run(steady(0.6 * CAPACITY))
    summary = result.summary()
    assert summary["requests"] > 2500 and summary["refused"] == 0 and summary["within_slo"] == 1.0
    assert all(o.done is not None and o.done - o.arrived >= 0.05 - 1e-9 for o in result.outcomes)  # one batch at least


def test_above_capacity_admission_refuses_rather_than_queues_to_miss():
    result = run(steady(2.0 * CAPACITY))
    answered = [o for o in result.outcomes if o.done is not None]
    refused = [o for o in result.outcomes if o.refused]
    assert not set(map(id, answered)) & set(map(id, refused))  # each request ends one way
    assert 0.35 < len(refused) / len(result.outcomes) < 0.65  # about half of twice capacity
    assert sum(o.in_slo for o in answered) / len(answered) > 0.98  # what it takes, it answers in time
    assert len(answered) / 30.0 > 0.85 * CAPACITY  # and it keeps the device busy


def test_a_run_pauses_the_cyclic_collector_and_leaves_it_as_it_found_it():
    seen: list[bool] = []

    class Watched(DayTrace):
        def arrivals(self):  # type: ignore[no-untyped-def]
            for arrival in super().arrivals():
                seen.append(gc.isenabled())
                yield arrival

    assert gc.isenabled()
    result = Fleet(SETTINGS.config(), SETTINGS.device(), None, None, FleetSettings(start_s=0.0)).run(
        Watched(day_s=5.0, trough_rps=100.0, peak_rps=100.0, spikes=()).arrivals(), 5.0, SETTINGS.slo_ms / 1000.0)
    assert len(result.outcomes) == len(seen) > 300 and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # (off before: off after)
    finally:
        gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("a run that fails")
    assert gc.isenabled()


def test_an_autoscaler_adds_replicas_that_take_traffic_once_started():
    trace = DayTrace(day_s=600.0, trough_rps=0.5 * CAPACITY, peak_rps=2.5 * CAPACITY, spikes=())
    # (GPU utilisation: a few replicas; the predicted wait ratchets to ~100 here, which only costs the test time)
    scaled = next(p for p in policies(CAPACITY, 60.0, 0.4) if p.name == "utilisation")
    fleet = Fleet(SETTINGS.config(), SETTINGS.device(), scaled.hpa, scaled.signals, FleetSettings(start_s=60.0))
    result = fleet.run(trace.arrivals(), trace.day_s, SETTINGS.slo_ms / 1000.0)
    assert result.summary()["peak_replicas"] >= 3
    ready_at = {r.name: r.ready_at for r in fleet.replicas}
    assert min(ready_at.values()) == 0.0 and max(ready_at.values()) >= 60.0
    for outcome in result.outcomes:  # none was sent to a replica still starting
        assert outcome.served_by is None or outcome.arrived >= ready_at[outcome.served_by]
    asked = sum(min(r.removed if r.removed is not None else 600.0, 600.0) - r.started for r in fleet.replicas)
    assert abs(result.replica_s - asked) < 1e-6  # GPU time counts from the ask, starting included
    assert result.replica_s > sum(min(r.removed if r.removed is not None else 600.0, 600.0) - r.ready_at
                                  for r in fleet.replicas if r.ready_at < 600.0)


def test_hpa_on_no_load_scales_down_after_its_window():
    trace = steady(1.0, seconds=900.0)
    policy = next(p for p in policies(CAPACITY, 60.0, 0.4) if p.name == "waiting")
    assert run(trace, policy, initial=4).replicas_over_time[-1][1] == 1


def test_the_oracle_asks_for_each_minutes_need_a_start_ahead():
    trace = DayTrace(day_s=600.0, trough_rps=100.0, peak_rps=100.0, spikes=(0.5,), spike_factor=4.0, spike_ramp_s=1.0,
                     spike_s=60.0)
    replicas = oracle_replicas(trace.rate, 100.0, trace.day_s, start_s=60.0)
    assert replicas(0.0) == 1 and replicas(200.0) == 1
    assert replicas(240.0) == 4  # the spike at 300-361 s, asked for 60 s ahead
    assert replicas(380.0) == 4 and replicas(420.0) == 1  # its last second falls in the minute from 360 s


def test_a_scaler_that_knows_the_present_misses_only_what_arrives_while_its_replicas_start():
    """The bound on any reactive signal (`present_replicas`): at a step from 100 to 400 req/s (one replica
    serves 160), it asks for three replicas within a second, ready a start (20 s) later; what it misses
    arrives in between, and nothing after."""
    from inferd.planning.policies import present_replicas

    trace = DayTrace(day_s=120.0, trough_rps=100.0, peak_rps=100.0, spikes=(0.25,), spike_factor=4.0, spike_ramp_s=0.1,
                     spike_s=200.0)
    replicas = present_replicas(trace.rate, CAPACITY)
    assert replicas(10.0) == 1 and replicas(40.0) == 3 and present_replicas(trace.rate, CAPACITY, 1.3)(40.0) == 4
    fleet = Fleet(SETTINGS.config(), SETTINGS.device(), None, None, FleetSettings(start_s=20.0))
    fleet.fixed, fleet.fixed_step_s = replicas, 1.0
    result = fleet.run(trace.arrivals(), trace.day_s, SETTINGS.slo_ms / 1000.0)
    missed = [o.arrived for o in result.outcomes if not o.in_slo]
    assert len(missed) > 1000 and 30.0 <= min(missed) and max(missed) <= 52.0, (len(missed), min(missed), max(missed))


def test_a_device_costs_by_bucket():
    device = SimDevice(50.0, 2.0, (1.0, 3.0))
    assert device(10, 0) == 0.07 and abs(device(10, 1) - 0.21) < 1e-12
    assert replace(SETTINGS, long_factor=2.0).device()(8, 1) == 0.1
    assert HpaSettings((Trigger("m", 1.0),)).down_window_s == 300.0


def test_inferd_plan_prints_each_policy_beside_the_oracle(tmp_path, capsys):
    import json

    from inferd.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--day-s", "300", "--trough-rps", "20", "--peak-rps", "60", "--policies", "waiting",
                 "--out", str(out)]) == 0
    table, said = capsys.readouterr()
    assert "| oracle |" in table and "| waiting |" in table and "| predicted_wait |" not in table
    # (on stderr: a day this short is said to mislead, and each run is said as it ends)
    assert "a day of 300 s is short" in said and "at least 1200 s" in said
    assert "2 runs (the oracle and 1 policies)" in said and "oracle done (" in said and "waiting done (2 of 2" in said
    result = json.loads(out.read_text())
    assert set(result["policies"]) == {"oracle", "waiting"} and result["capacity_rps"] > 0
    assert all(row["requests"] > 5000 for row in result["policies"].values())


def test_a_plan_run_in_processes_of_their_own_is_the_plan_run_in_one():
    from inferd.planning.plan import plan

    settings, trace = PlanSettings(), DayTrace(day_s=200.0, trough_rps=20.0, peak_rps=60.0)
    alone, apart = (plan(settings, trace, ["waiting", "shipped"], jobs=jobs) for jobs in (1, 2))
    for result in (alone, apart):
        assert list(result["policies"]) == ["oracle", "waiting", "shipped"]
        for row in result["policies"].values():
            row.pop("sim_s")
    assert apart == alone and alone["policies"]["shipped"]["requests"] > 3000


def test_the_shipped_demand_signal_asks_for_a_spikes_replicas_in_one_step_and_lets_them_go():
    """The request rate against 82% of a replica's capacity: a jump to 2.4x capacity asks for
    ceil(2.4 / 0.82) = 3 replicas once the last two scrapes read were both after it (utilisation, capped at
    100%, asks for at most 1.43x the current count each time), no more, and once the spike is over the
    fleet comes back to one."""
    trace = DayTrace(day_s=500.0, trough_rps=0.3 * CAPACITY, peak_rps=0.3 * CAPACITY, spikes=(0.2,), spike_factor=8.0,
                     spike_ramp_s=1.0, spike_s=100.0)
    shipped = next(p for p in policies(CAPACITY, 30.0, 0.4) if p.name == "shipped")
    shipped = replace(shipped, hpa=replace(shipped.hpa, down_window_s=60.0))  # (a shorter day than 120 s allows)
    result = run(trace, shipped, start_s=30.0)
    changes = result.replicas_over_time[1:]
    assert changes and 100.0 < changes[0][0] <= 100.0 + 2.5 + 5.0 + 5.0, changes  # (the scrape's age, a scrape, a poll)
    reached = next(at for at, n in changes if n == 3)
    assert reached <= 100.0 + 2.5 + 2 * 5.0 + 5.0, changes  # (two scrapes after the jump)
    assert max(n for _, n in changes) == 3 and changes[-1][1] == 1, changes


def test_the_simulated_shipped_policy_is_the_scaledobject_that_ships():
    """`inferd plan`'s `shipped` reads what deploy/k8s/keda-scaledobject.yaml asks Prometheus for, at the
    scrape interval of deploy/prometheus/prometheus-k8s.yml's job, the ScaledObject's polling interval and
    scale-down window, and the threshold there is the share of a replica's capacity the simulation uses
    (of ~400 req/s, MiniLM on a 2-core pod)."""
    import re
    from pathlib import Path

    import yaml

    deploy = Path(__file__).parents[3] / "deploy"
    spec = yaml.safe_load((deploy / "k8s/keda-scaledobject.yaml").read_text())["spec"]
    (trigger,) = spec["triggers"]
    assert trigger["metricType"] == "AverageValue"
    assert re.fullmatch(r'sum\(irate\(inferd_requests_total\{app="inferd"\}\[1m\]\)\)', trigger["metadata"]["query"])
    scraping = yaml.safe_load((deploy / "prometheus/prometheus-k8s.yml").read_text())
    (job,) = scraping["scrape_configs"]
    scrape_s = float(job.get("scrape_interval", scraping["global"]["scrape_interval"]).removesuffix("s"))
    shipped = next(p for p in policies(400.0, 60.0, 1.0) if p.name == "shipped")
    (simulated,) = shipped.hpa.triggers
    assert simulated.metric == "demand" and simulated.average and simulated.target == float(trigger["metadata"]["threshold"])
    assert shipped.hpa.lag_s == scrape_s / 2  # (the newest scrape's age, on average)
    assert shipped.hpa.poll_s == spec["pollingInterval"]
    assert shipped.hpa.down_window_s == spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"]


def test_tiers_in_a_trace_are_served_by_priority_and_reported_each():
    """At twice one replica's capacity, a fifth of the requests enterprise (its own 250 ms objective) and the
    rest free: the replica's own tiered admission and batching keep enterprise within its objective first,
    and the summary gives each tier's share."""
    from inferd.config import TierConfig
    from inferd.planning.plan import parse_tiers

    tiers, shares = parse_tiers("enterprise:0.2:250,free:0.8")
    assert [t.name for t in tiers] == ["enterprise", "free"] and tiers[0].slo_ms == 250.0 and shares[1] == ("free", 0.8)
    trace = replace(steady(2.0 * CAPACITY, seconds=20.0), tiers=shares)
    fleet = Fleet(SETTINGS.config(), SETTINGS.device(), None, None, FleetSettings(start_s=0.0), tiers=tiers)
    result = fleet.run(trace.arrivals(), trace.day_s, SETTINGS.slo_ms / 1000.0)
    by_tier = result.summary()["by_tier"]
    assert set(by_tier) == {"enterprise", "free"}
    assert 0.15 < by_tier["enterprise"]["requests"] / result.summary()["requests"] < 0.25
    assert by_tier["enterprise"]["within_slo"] > 0.95 > by_tier["free"]["within_slo"], by_tier
    assert {o.slo_s for o in result.outcomes if o.tier == "enterprise"} == {0.25}  # (its own, the tighter)
    assert {o.slo_s for o in result.outcomes if o.tier == "free"} == {0.4}
    assert TierConfig("default") in SETTINGS.tier_configs()


def test_a_higher_tier_joining_a_lower_tiers_lingering_batch_at_light_load_is_admitted_and_in_time():
    """Found with --tiers: at an eighth of a replica's capacity, enterprise (its own 600 ms objective against
    the model's 1 s) joining the partial batch free's requests linger in was predicted to wait for that
    batch's linger and refused (3%), and its batch, sent to end exactly at its due, ended late behind a
    batch in progress (2%). Now its due pulls the prediction in, and the batch goes a batch's time early."""
    from inferd.planning.plan import PlanSettings, parse_tiers

    tiers, shares = parse_tiers("enterprise:0.2:600,free:0.8")
    settings = PlanSettings(tiers=tiers)
    trace = DayTrace(day_s=120.0, trough_rps=10.0, peak_rps=10.0, spikes=(), tiers=shares)
    fleet = Fleet(settings.config(), settings.device(), None, None, FleetSettings(start_s=0.0), tiers=settings.tier_configs())
    enterprise = fleet.run(trace.arrivals(), trace.day_s, 1.0).summary()["by_tier"]["enterprise"]
    assert enterprise["requests"] > 200 and enterprise["refused"] == 0.0 and enterprise["within_slo"] == 1.0, enterprise


def test_a_lower_tier_beside_a_higher_tiers_own_objective_is_not_refused_at_half_load():
    """Found with --tiers: at half a replica's capacity (40 req/s against ~72), free (the model's 1 s) beside
    enterprise (its own 600 ms) was refused 9.9%: its wait counted enterprise's early batches as taking a
    whole batch each, though free's requests of the same bucket ride in them. Now enterprise counts for
    the slots its requests took."""
    from inferd.planning.plan import PlanSettings, parse_tiers

    tiers, shares = parse_tiers("enterprise:0.2:600,free:0.8")
    settings = PlanSettings(tiers=tiers)
    trace = DayTrace(day_s=60.0, trough_rps=40.0, peak_rps=40.0, spikes=(), tiers=shares)
    fleet = Fleet(settings.config(), settings.device(), None, None, FleetSettings(start_s=0.0), tiers=settings.tier_configs())
    by_tier = fleet.run(trace.arrivals(), trace.day_s, 1.0).summary()["by_tier"]
    assert by_tier["free"]["requests"] > 1500 and by_tier["free"]["refused"] <= 0.01, by_tier
    assert by_tier["free"]["within_slo"] >= 0.99 and by_tier["enterprise"]["within_slo"] >= 0.99, by_tier


def test_a_higher_tier_with_its_own_objective_in_a_bucket_of_its_own_still_counts_all_of_its_batches():
    """S10's step at 200%: enterprise (200 ms of its own, 30% of capacity) alone in the long bucket, free
    (the model's 300 ms) in the short one. No free request rides in enterprise's early batches, so each
    counts whole against free's wait; counted for less, 2% of what free got came late."""
    import random

    from inferd.config import TierConfig
    from inferd.planning.traces import Arrival

    tiers = (TierConfig("enterprise", priority=2, slo_ms=200.0), TierConfig("free", priority=0))
    settings = PlanSettings(latency_ms=50.0, per_item_ms=0.0, long_factor=1.0, max_batch_size=32, max_wait_ms=5.0,
                            slo_ms=300.0, tiers=tiers)
    rng, arrivals = random.Random(1), []
    for rate, bucket, tier in ((192.0, 1, "enterprise"), (1088.0, 0, "free")):
        at = rng.expovariate(rate)
        while at < 10.0:
            arrivals.append(Arrival(at, bucket, tier))
            at += rng.expovariate(rate)
    arrivals.sort(key=lambda a: a.at)
    fleet = Fleet(settings.config(), settings.device(), None, None, FleetSettings(start_s=0.0), tiers=settings.tier_configs())
    result = fleet.run(arrivals, 10.0, 0.3)
    for tier in ("enterprise", "free"):
        served = [o for o in result.outcomes if o.tier == tier and o.done is not None]
        assert len(served) > 1500 and all(o.in_slo for o in served), (tier, len(served), sum(not o.in_slo for o in served))
