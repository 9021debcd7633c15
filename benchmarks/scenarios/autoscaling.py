"""Autoscaling on a day of traffic (issue 53): `inferd plan`'s fleet simulator (each replica inferd's own
batcher, cost model and admission on a virtual clock; Kubernetes' HPA algorithm; replicas starting in
60 s) on a compressed diurnal day (trough to peak x8, three x4 spikes, a tenth of the inputs in a long
length bucket that costs twice as much), each scaling policy beside the oracle. Writes the table, the
per-policy figures and a plot of the rate and each policy's replicas over the day. `--demand-targets
0.8,0.7,...`: the demand policy at each target share of a replica's capacity instead (its headroom's
price and worth); `--present 1.0,1.2,...`: a scaler that knows the rate of each moment exactly, at
each headroom (the bound on any signal read from the fleet, `present_replicas`). `--live`: the shipped
policy on a live fleet of `inferd serve` processes behind
HAProxy (a 600 s day with one x2 spike) beside the simulator fed the same arrivals.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, own_option, parse_args

from inferd.planning.plan import PlanSettings, capacity_at_objective, plan, run_policy, summary_table
from inferd.planning.policies import SHIPPED_TARGET, oracle_replicas, policies, present_replicas, shipped_policy
from inferd.planning.traces import DayTrace


def frontier(day_s: float, targets: list[float], out: Path, headrooms: list[float] | None = None) -> None:
    """The demand policy at each target share of a replica's capacity, beside the oracle and GPU
    utilisation: what each point of headroom buys in attainment and costs in GPU-hours. With `headrooms`,
    instead of the demand policy: a scaler that knows the rate of each moment exactly (`present_replicas`,
    asked every second), at each headroom: the bound on what any signal read from the fleet can keep."""
    settings, trace = PlanSettings(), DayTrace(day_s=day_s)
    capacity = capacity_at_objective(settings, trace)
    runs: list[tuple[str, Any]] = [("oracle", None)]
    if headrooms:
        runs += [(f"present x{h:.2f}", present_replicas(trace.rate, capacity, h)) for h in headrooms]
    else:
        runs += [("utilisation", None)] + [(f"demand {target:.2f}", shipped_policy(capacity, target)) for target in targets]
    named = {p.name: p for p in policies(capacity, settings.start_s, settings.slo_ms / 1000.0)}
    rows = {}
    for name, policy in runs:
        if name == "oracle":
            result, took = run_policy(settings, trace, None, oracle_replicas(trace.rate, capacity, trace.day_s, settings.start_s))
        elif name.startswith("present"):
            result, took = run_policy(settings, trace, None, policy, oracle_step_s=1.0)
        else:
            result, took = run_policy(settings, trace, policy or named.get(name))
        missed = sum(1 for o in result.outcomes if not o.in_slo)
        rows[name] = {**result.summary(), "missed": missed, "sim_s": round(took, 1)}
        print(name, rows[name], flush=True)
    oracle_hours = rows["oracle"]["gpu_hours"] or 1e-9
    what = "A scaler that knows the present exactly" if headrooms else "The demand signal's headroom"
    lines = [f"### {what} on a {day_s:.0f} s day (60 s starts; one replica serves {capacity:.1f} "
             "req/s within the objective)", "",
             "| policy | within the objective | refused | missed requests | GPU-hours | of the oracle's | peak replicas | "
             "scale events | simulated in |", "|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['within_slo']:.2%} | {row['refused']:.2%} | {row['missed']:,} | {row['gpu_hours']:.2f} | "
                     f"{row['gpu_hours'] / oracle_hours:.2f} | {row['peak_replicas']} | {row['scale_events']} | "
                     f"{row['sim_s']:.0f} s |")
    text = "\n".join(lines) + "\n"
    print(text)
    stem = f"autoscaling_{'present' if headrooms else 'demand'}_{day_s:.0f}s"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"capacity_rps": capacity, "trace": trace.__dict__, "policies": rows}) + "\n")


def live(day_s: float, out: Path) -> None:
    """The shipped demand policy on a live fleet (`inferd serve` processes behind HAProxy, `planning.live`)
    and in the simulator, fed the same arrivals: do they agree?"""
    import asyncio
    import tempfile
    from dataclasses import replace

    from inferd.planning.fleet import Fleet, FleetSettings
    from inferd.planning.live import LiveFleet, LiveSettings

    model = PlanSettings(long_factor=1.0)
    trace = DayTrace(day_s=day_s, trough_rps=30.0, peak_rps=250.0, spikes=(0.6,), spike_factor=2.0, spike_ramp_s=20.0,
                     spike_s=60.0, long_share=0.0)
    capacity = capacity_at_objective(model, trace, seconds=60.0)
    policy = shipped_policy(capacity)
    policy = replace(policy, hpa=replace(policy.hpa, down_window_s=60.0, max_replicas=8))
    start_s, until_s, slo_s = 20.0, day_s + 30.0, model.slo_ms / 1000.0
    arrivals = list(trace.arrivals())

    async def on_a_live_fleet() -> Any:
        with tempfile.TemporaryDirectory() as workdir:
            async with LiveFleet(LiveSettings(model=model, start_s=start_s, sample_s=5.0, max_replicas=8), policy, Path(workdir)) as fleet:
                return await fleet.run(arrivals, until_s, slo_s), fleet.failures

    began = time.perf_counter()
    live_result, failures = asyncio.run(on_a_live_fleet())
    took = time.perf_counter() - began
    simulated = Fleet(model.config(), model.device(), policy.hpa, policy.signals, FleetSettings(start_s=start_s, sample_s=5.0),
                      buckets=1).run(iter(arrivals), until_s, slo_s)
    rows = {"live": live_result, "simulated": simulated}
    lines = [f"### A live fleet against the simulator ({day_s:.0f} s day, {len(arrivals):,} requests; one replica serves "
             f"{capacity:.1f} req/s within the objective; the shipped demand policy at {SHIPPED_TARGET}, {start_s:.0f} s starts, 60 s "
             "down-stabilisation)", "",
             "| fleet | within the objective | refused | replica-minutes | peak replicas | scale events | replicas over time |",
             "|---|---|---|---|---|---|---|"]
    for name, result in rows.items():
        summary = result.summary()
        steps = ", ".join(f"{n} at {t:.0f} s" for t, n in result.replicas_over_time)
        lines.append(f"| {name} | {summary['within_slo']:.2%} | {summary['refused']:.2%} | {result.replica_s / 60:.1f} | "
                     f"{summary['peak_replicas']} | {summary['scale_events']} | {steps} |")
    live_summary, simulated_summary = live_result.summary(), simulated.summary()
    lines += ["", f"Attainment {abs(live_summary['within_slo'] - simulated_summary['within_slo']) * 100:.2f} points apart, "
              f"replica-minutes {abs(live_result.replica_s / simulated.replica_s - 1):.1%} apart (goal: within 1 point and "
              f"10%); {len(failures)} requests neither answered nor refused. The live run took {took:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "autoscaling_live.md").write_text(text)
    (out / "autoscaling_live.json").write_text(json.dumps(
        {"capacity_rps": capacity, "trace": trace.__dict__, "failures": failures[:20],
         **{name: {**result.summary(), "replica_s": result.replica_s, "replicas": result.replicas_over_time}
            for name, result in rows.items()}}) + "\n")


def main() -> None:
    day_s = float(own_option("--day-s") or 3600)
    targets = own_option("--demand-targets")
    headrooms = own_option("--present")
    on_a_live_fleet = "--live" in sys.argv
    if on_a_live_fleet:
        sys.argv.remove("--live")
    args = parse_args(__doc__ or "")
    if on_a_live_fleet:
        out = Path(args.out_dir or RESULTS)
        out.mkdir(parents=True, exist_ok=True)
        live(120.0 if args.quick else min(day_s, 600.0), out)
        return
    if targets or headrooms:
        out = Path(args.out_dir or RESULTS)
        out.mkdir(parents=True, exist_ok=True)
        frontier(600.0 if args.quick else day_s, [float(t) for t in (targets or "").split(",") if t], out,
                 [float(h) for h in headrooms.split(",")] if headrooms else None)
        return
    if args.quick:
        day_s = 600.0
    settings, trace = PlanSettings(), DayTrace(day_s=day_s)
    began = time.perf_counter()
    result = plan(settings, trace)
    took = time.perf_counter() - began
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    text = (f"### Autoscaling on a compressed day ({day_s:.0f} s; 60 s starts, 300 s down-stabilisation)\n\n"
            + summary_table(result) + f"\n\nSimulated in {took:.0f} s on this machine (all policies, the oracle and "
            "the capacity's calibration).\n")
    print(text)
    (out / "autoscaling.md").write_text(text)
    (out / "autoscaling.json").write_text(json.dumps(result) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(result["policies"])
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 * len(names)), sharex=True)
    times = [t for t in range(0, int(day_s), 10)]
    for ax, name in zip(axes, names, strict=True):
        row = result["policies"][name]
        steps = row["replicas"] + [(day_s, row["replicas"][-1][1])]
        ax.step([t for t, _ in steps], [n for _, n in steps], where="post", label="replicas")
        ax.set_ylabel("replicas")
        twin = ax.twinx()
        twin.plot(times, [trace.rate(t) for t in times], color="grey", alpha=0.5, label="req/s")
        twin.set_ylabel("req/s")
        ax.set_title(f"{name}: {row['within_slo']:.2%} within the objective, {row['gpu_hours']:.1f} GPU-hours")
    axes[-1].set_xlabel("seconds into the (compressed) day")
    fig.tight_layout()
    fig.savefig(out / "autoscaling.png", dpi=80)


if __name__ == "__main__":
    main()
