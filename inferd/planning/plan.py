"""`inferd plan`: how many replicas a day of traffic needs, and what each scaling policy would have
cost and missed, from the server's own scheduling code on a virtual clock (see `fleet`)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..config import DEFAULT_TIER_PRIORITIES, ModelConfig, TierConfig
from .fleet import Fleet, FleetResult, FleetSettings
from .hpa import HpaSettings
from .policies import SHIPPED_TARGET, Policy, oracle_replicas, policies
from .recorded import RecordedDay, model_from_description, read_access_log
from .replica import Device, SimDevice
from .traces import DayTrace, drawn_beside


@dataclass(frozen=True)
class PlanSettings:
    """The model (the simulated GPU's costs and its batch settings), its objective, the fleet's start-up."""

    latency_ms: float = 100.0
    per_item_ms: float = 2.0
    long_factor: float = 2.0  # a long input's batch costs this many times a short one's
    max_batch_size: int = 16
    max_wait_ms: float = 10.0
    slo_ms: float = 1000.0
    timeout_ms: float = 2000.0
    start_s: float = 60.0
    target_attainment: float = 0.995
    tiers: tuple[TierConfig, ...] = ()  # (none: every request of one tier; else highest priority first)

    def tier_configs(self) -> tuple[TierConfig, ...]:
        return self.tiers or (TierConfig("default"),)

    def config(self) -> ModelConfig:
        return ModelConfig(name="m", backend="inferd.backends.sim:create", max_batch_size=self.max_batch_size,
                           max_wait_ms=self.max_wait_ms, max_queue=100_000, timeout_ms=int(self.timeout_ms),
                           slo_ms=self.slo_ms)

    def device(self) -> SimDevice:
        return SimDevice(self.latency_ms, self.per_item_ms, (1.0, self.long_factor))


def capacity_at_objective(settings: PlanSettings, trace: DayTrace | RecordedDay, seconds: float = 120.0,
                          device: Device | None = None) -> float:
    """The highest steady rate (of the trace's mix) one replica serves with `target_attainment` of its
    requests within the objective: found by bisection on simulated runs."""
    device = device or settings.device()
    low, high = 0.0, 2.0 * settings.max_batch_size / (device(settings.max_batch_size, 0) or 1e-3)
    for _ in range(9):
        rate = (low + high) / 2
        steady = DayTrace(day_s=seconds, trough_rps=rate, peak_rps=rate, spikes=(), long_share=trace.long_share,
                          tiers=trace.tiers if isinstance(trace, DayTrace) else ())
        fleet = Fleet(settings.config(), device, None, None, FleetSettings(start_s=0.0), tiers=settings.tier_configs())
        result = fleet.run(steady.arrivals(), seconds, settings.slo_ms / 1000.0)
        if result.summary()["within_slo"] >= settings.target_attainment:
            low = rate
        else:
            high = rate
    return low


def run_policy(settings: PlanSettings, trace: DayTrace | RecordedDay, policy: Policy | None, oracle: Any = None,
               device: Device | None = None, oracle_step_s: float = 10.0) -> tuple[FleetResult, float]:
    fleet = Fleet(settings.config(), device or settings.device(), policy.hpa if policy else None,
                  policy.signals if policy else None, FleetSettings(start_s=settings.start_s), tiers=settings.tier_configs())
    if oracle is not None:
        fleet.fixed, fleet.fixed_step_s = oracle, oracle_step_s
        fleet.settings.initial_replicas = oracle(0.0)
    began = time.perf_counter()
    arrivals = drawn_beside(trace) if isinstance(trace, DayTrace) else trace.arrivals()
    result = fleet.run(arrivals, trace.day_s, settings.slo_ms / 1000.0)
    return result, time.perf_counter() - began


def plan(settings: PlanSettings, trace: DayTrace | RecordedDay, names: list[str] | None = None, demand_target: float = SHIPPED_TARGET,
         device: Device | None = None, jobs: int = 1, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Each policy (`names`, default all) beside the oracle on `trace`: a synthetic day, or a recorded one
    (`recorded`) with the model's measured `device`. `jobs`: runs at once, each in a process of its own
    (one run is one core's work: a whole day takes ~20 minutes and ~2 GB); `progress` is told of each run
    as it ends."""
    capacity = capacity_at_objective(settings, trace, device=device)
    chosen = [p.name for p in policies(capacity, settings.start_s, settings.slo_ms / 1000.0, demand_target)
              if names is None or p.name in names]
    runs = [PlanRun(settings, trace, name, capacity, demand_target, device) for name in ("oracle", *chosen)]
    began = time.perf_counter()
    at_once = min(jobs, len(runs))
    progress(f"{len(runs)} runs (the oracle and {len(chosen)} policies), {at_once} at a time")
    rows: dict[str, dict[str, Any]] = {}

    def ended(row: tuple[str, dict[str, Any]]) -> None:
        rows[row[0]] = row[1]
        progress(f"{row[0]} done ({len(rows)} of {len(runs)}, {time.perf_counter() - began:.0f} s so far)")

    if at_once > 1:
        # (spawned, not forked: a process forked while another thread holds a lock may hang on it)
        with ProcessPoolExecutor(max_workers=at_once, mp_context=multiprocessing.get_context("spawn")) as pool:
            for row in pool.map(plan_row, runs):
                ended(row)
    else:
        for run in runs:
            ended(plan_row(run))
    rows = {run.policy: rows[run.policy] for run in runs}  # (in the runs' order, as before)
    described = trace.__dict__ if isinstance(trace, DayTrace) else {"recorded_requests": len(trace.recorded), "day_s": trace.day_s}
    return {"capacity_rps": round(capacity, 1), "settings": settings.__dict__, "trace": described, "policies": rows}


@dataclass(frozen=True)
class PlanRun:
    """One of a plan's runs, as a process of its own is handed it: the policy by name (a policy's signals
    are closures, made again where it runs)."""

    settings: PlanSettings
    trace: DayTrace | RecordedDay
    policy: str  # a name of `policies`, or "oracle"
    capacity_rps: float
    demand_target: float
    device: Device | None


def plan_row(run: PlanRun) -> tuple[str, dict[str, Any]]:
    """One run of a plan: its policy's name and its row (the summary, the replicas over the day and, for a
    policy, what each sample read)."""
    settings, trace = run.settings, run.trace
    if run.policy == "oracle":
        oracle = oracle_replicas(trace.rate, run.capacity_rps, trace.day_s, settings.start_s)
        result, took = run_policy(settings, trace, None, oracle, run.device)
        return run.policy, {**result.summary(), "sim_s": round(took, 1), "replicas": result.replicas_over_time}
    policy = next(p for p in policies(run.capacity_rps, settings.start_s, settings.slo_ms / 1000.0, run.demand_target)
                  if p.name == run.policy)
    result, took = run_policy(settings, trace, policy, device=run.device)
    return run.policy, {**result.summary(), "sim_s": round(took, 1), "replicas": result.replicas_over_time,
                        "samples": [(s.at, s.ready, round(s.utilisation, 3), s.waiting, round(s.predicted_wait_s, 4),
                                     round(s.arrival_rps, 1)) for s in result.samples]}


def summary_table(result: dict[str, Any]) -> str:
    """The plan as a markdown table: each policy beside the oracle."""
    oracle_hours = result["policies"]["oracle"]["gpu_hours"] or 1e-9
    lines = [f"one replica's capacity within the objective: {result['capacity_rps']} req/s", "",
             "| policy | within the objective | refused | GPU-hours | of the oracle's | peak replicas | scale events |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["policies"].items():
        lines.append(f"| {name} | {row['within_slo']:.2%} | {row['refused']:.2%} | {row['gpu_hours']:.2f} | "
                     f"{row['gpu_hours'] / oracle_hours:.2f} | {row['peak_replicas']} | {row['scale_events']} |")
    tiers = sorted({tier for row in result["policies"].values() for tier in row.get("by_tier", {})})
    if tiers:
        lines += ["", "| policy | " + " | ".join(f"{tier}: within / refused" for tier in tiers) + " |",
                  "|---|" + "---|" * len(tiers)]
        for name, row in result["policies"].items():
            cells = [row["by_tier"].get(tier) for tier in tiers]
            lines.append(f"| {name} | " + " | ".join(f"{c['within_slo']:.2%} / {c['refused']:.2%}" if c else "-"
                                                     for c in cells) + " |")
    return "\n".join(lines)


def command(args: argparse.Namespace) -> int:
    """`inferd plan` (its options: `inferd.cli`): a synthetic day, or the one a server recorded."""
    names = args.policies.split(",") if args.policies else None
    window_s = HpaSettings(triggers=()).down_window_s  # (the autoscaler's, to scale down)
    short = max(20 * args.start_s, 2 * window_s)  # (beside a replica's start, and that window)
    if args.day_s < short and not args.access_log:
        print(f"inferd plan: a day of {args.day_s:.0f} s is short beside a replica's start ({args.start_s:.0f} s) and the "
              f"autoscaler's {window_s:.0f} s window to scale down, which stay in real seconds: the "
              f"replicas lag this day more than a real one (at least {short:.0f} s for a plan to read)", file=sys.stderr)
    say = partial(print, "inferd plan:", file=sys.stderr, flush=True)
    if args.access_log or args.served_model:
        if not (args.access_log and args.served_model):
            print("inferd plan: --access-log and --served-model go together", file=sys.stderr)
            return 2
        served = model_from_description(json.loads(Path(args.served_model).read_text()))
        skipped: Counter[str] = Counter()
        recorded = RecordedDay(tuple(read_access_log(Path(args.access_log), served.name, args.sample_rate, skipped)))
        if skipped:
            why = ", ".join(f"{n} for its {reason}" if reason != "far from the rest" else f"{n} far from the rest"
                            for reason, n in skipped.most_common())
            print(f"inferd plan: skipped {sum(skipped.values())} lines of {args.access_log} ({why}): a latency must be "
                  "a number of ms from 0 to an hour, a timestamp readable, an arrival within a week of the median",
                  file=sys.stderr)
        if not recorded.recorded:
            print(f"inferd plan: {args.access_log} has no request of model {served.name!r}", file=sys.stderr)
            return 2
        settings = PlanSettings(max_batch_size=served.max_batch_size, max_wait_ms=served.max_wait_ms,
                                slo_ms=served.slo_ms or args.slo_ms, timeout_ms=served.timeout_ms, start_s=args.start_s)
        result = plan(settings, recorded, names, args.demand_target or SHIPPED_TARGET, device=served.device, jobs=args.jobs,
                      progress=say)
    else:
        try:
            tiers, shares = parse_tiers(args.tiers) if args.tiers else ((), ())
        except ValueError as exc:
            print(f"inferd plan: {exc}", file=sys.stderr)
            return 2
        settings = PlanSettings(latency_ms=args.latency_ms, per_item_ms=args.per_item_ms, long_factor=args.long_factor,
                                max_batch_size=args.max_batch_size, slo_ms=args.slo_ms, start_s=args.start_s, tiers=tiers)
        trace = DayTrace(day_s=args.day_s, trough_rps=args.trough_rps, peak_rps=args.peak_rps,
                         spike_factor=args.spike_factor, long_share=args.long_share, tiers=shares)
        result = plan(settings, trace, names, args.demand_target or SHIPPED_TARGET, jobs=args.jobs, progress=say)
    print(summary_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result) + "\n")
    return 0


def parse_tiers(text: str) -> tuple[tuple[TierConfig, ...], tuple[tuple[str, float], ...]]:
    """`--tiers enterprise:0.2:300,free:0.8`: each tier's share of the requests and, optionally, its own
    objective in ms; priorities as a config's defaults give them (enterprise 2, paid 1, free 0)."""
    tiers, shares = [], []
    for part in text.split(","):
        name, share, *objective = part.split(":")
        tiers.append(TierConfig(name, priority=DEFAULT_TIER_PRIORITIES.get(name, 0),
                                slo_ms=float(objective[0]) if objective else None))
        shares.append((name, float(share)))
    if abs(sum(share for _, share in shares) - 1.0) > 1e-6:
        raise ValueError(f"--tiers {text!r}: the shares must add up to 1")
    return tuple(sorted(tiers, key=lambda t: -t.priority)), tuple(shares)
