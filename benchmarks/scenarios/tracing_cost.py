"""What tracing costs the request path: S2 (10 ms per batch of up to 100, wrk at 100 and 400 clients)
with tracing off, on at 1% and on at 100%, alternated round by round in one run. Spans go through the
batching processor to a file exporter writing to /dev/null: the SDK's own cost, serialisation included,
without a collector's. The figures are medians of the server's CPU µs per request and of throughput.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from common import RESULTS, inferd_server, parse_args, sim_config, step

BODY = b'{"input": "E equals {i}"}'
CLIENTS = (100, 400)
VARIANTS = {
    "off": "",
    "on at 1%": '\n[tracing]\nsample_rate = 0.01\nexporter = "file"\npath = "/dev/null"\n',
    "on at 100%": '\n[tracing]\nsample_rate = 1.0\nexporter = "file"\npath = "/dev/null"\n',
}

if __name__ == "__main__":
    args = parse_args(__doc__)
    runs: dict[str, dict[int, list[dict[str, float]]]] = {v: {c: [] for c in CLIENTS} for v in VARIANTS}
    for _ in range(1 if args.quick else 3):
        for variant, table in VARIANTS.items():
            with inferd_server(sim_config(latency_ms=10) + table) as url:
                for clients in CLIENTS:
                    r = step(url, clients=clients, duration_s=8, quick=args.quick, processes=2, body=BODY)
                    runs[variant][clients].append({"rps": r["achieved_rps"], "cpu_us": r["server"]["cpu_us_per_request"]})
    summary = {variant: {c: {"rps": round(statistics.median(x["rps"] for x in xs), 1),
                             "cpu_us": statistics.median(x["cpu_us"] for x in xs)} for c, xs in by.items()}
               for variant, by in runs.items()}
    out = Path(args.out_dir or RESULTS)
    (out / "tracing_cost.json").write_text(json.dumps({"summary": summary, "runs": runs, "note": __doc__}, indent=1) + "\n")
    lines = ["### Tracing's cost on S2 (medians of 3 alternated rounds)", "",
             "| tracing | clients | req/s | CPU µs/req | CPU over off |", "|---|---|---|---|---|"]
    for variant, by in summary.items():
        for clients, s in by.items():
            ratio = s["cpu_us"] / summary["off"][clients]["cpu_us"]
            lines.append(f"| {variant} | {clients} | {s['rps']:,.0f} | {s['cpu_us']} | {ratio:.3f} |")
    (out / "tracing_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
