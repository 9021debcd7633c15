"""Autoscaling on a day of traffic (issue 53): `inferd plan`'s fleet simulator (each replica inferd's own
batcher, cost model and admission on a virtual clock; Kubernetes' HPA algorithm; replicas starting in
60 s) on a compressed diurnal day (trough to peak x8, three x4 spikes, a tenth of the inputs in a long
length bucket that costs twice as much), each scaling policy beside the oracle. Writes the table, the
per-policy figures and a plot of the rate and each policy's replicas over the day.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from common import RESULTS, own_option, parse_args

from inferd.planning.plan import PlanSettings, plan, summary_table
from inferd.planning.traces import DayTrace


def main() -> None:
    day_s = float(own_option("--day-s") or 3600)
    args = parse_args(__doc__ or "")
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
