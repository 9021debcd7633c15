"""S13, a real model's tail: all-MiniLM-L6-v2 on this machine's CPU, single-input `/v1/embeddings`,
every input distinct, closed loop with 16, 64 and 256 clients (wrk), each run of 15 s on a fresh
server. The figure is p99 / p50 in every run (the goal: at most 2.5x), beside throughput. With
--baseline-tree, an earlier checkout the same way, the two alternated run by run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from common import RESULTS, inferd_server, parse_args, step

BODY = b'{"model": "minilm", "input": "request {i}: {words}"}'
CONFIG = """
[server]
access_log = "off"

[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = 32
max_wait_ms = 5
max_queue = 4000
timeout_ms = 30000
[models.options]
max_tokens = 128
bucket_edges = [16, 32, 64, 128]
"""
CLIENTS = (16, 64, 256)


def one_run(tree: str | None, clients: int, quick: bool) -> dict:
    kw = {"tree": tree} if tree else {}
    with inferd_server(CONFIG, **kw) as url:
        result = step(url, clients=clients, duration_s=15, quick=quick, body=BODY, path="/v1/embeddings", warmup_s=3)
    latency = result["latency_ms"]
    return {"rps": result["achieved_rps"], "p50_ms": latency["p50"], "p99_ms": latency["p99"],
            "p99_over_p50": round(latency["p99"] / latency["p50"], 2), "errors": result.get("errors", 0),
            "mean_batch": (result.get("server") or {}).get("mean_batch_size")}


if __name__ == "__main__":
    args = parse_args(__doc__, baseline=True)
    runs = 2 if args.quick else 5
    trees = {"inferd": None, **({"unchanged main": args.baseline_tree} if args.baseline_tree else {})}
    results: dict = {label: {c: [] for c in CLIENTS} for label in trees}
    for clients in CLIENTS:
        for _ in range(runs):
            for label, tree in trees.items():
                results[label][clients].append(one_run(tree, clients, args.quick))
                print(label, clients, results[label][clients][-1], flush=True)
    lines = ["### S13: MiniLM on the CPU, single-input /v1/embeddings, closed loop, a fresh server per run", "",
             "| server | clients | runs | req/s (median) | p50 ms (median) | p99 ms (each run) | p99 / p50 (each run) | worst p99 / p50 |",
             "|---|---|---|---|---|---|---|---|"]
    for label, by_clients in results.items():
        for clients, rs in by_clients.items():
            p99s = ", ".join(f"{r['p99_ms']:.0f}" for r in rs)
            ratios = ", ".join(str(r["p99_over_p50"]) for r in rs)
            lines.append(f"| {label} | {clients} | {len(rs)} | {statistics.median(r['rps'] for r in rs):,.0f} | "
                         f"{statistics.median(r['p50_ms'] for r in rs):.0f} | {p99s} | {ratios} | "
                         f"{max(r['p99_over_p50'] for r in rs)} |")
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S13.json").write_text(json.dumps({"results": results, "note": __doc__}, indent=2) + "\n")
    (out / "S13.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
