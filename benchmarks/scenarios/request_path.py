"""Before/after of a change to the request path: S2 (the simulated GPU, which costs the server no CPU)
and S9 (the real MiniLM front end, a stand-in only for the GPU's time) on this checkout and on
`--baseline-tree`, alternated round by round so both see the same machine (and which goes first swapped
each round); `--paths S9` runs one of them. 10 ms per batch of up to
100, wrk at 100 and 400 clients. The figures are the ratios of the medians, and the median of the
round-by-round ratios (this machine is noisy: one pair proves little).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from common import RESULTS, inferd_server, parse_args, sim_config, step
from s9_real_frontend import S9_BODY, standin_config

S2_BODY = b'{"input": "E equals {i}"}'
CLIENTS = (100, 400)


def measure(tree: str | None, config: str, body: bytes, quick: bool) -> dict[int, dict[str, float]]:
    kw = {"tree": tree} if tree else {}
    with inferd_server(config, **kw) as url:
        results = {c: step(url, clients=c, duration_s=8, quick=quick, processes=2, body=body) for c in CLIENTS}
    return {c: {"rps": r["achieved_rps"], "cpu_us": r["server"]["cpu_us_per_request"]} for c, r in results.items()}


def summarise(rounds: list[dict[str, dict[int, dict[str, float]]]], path: str, clients: int) -> dict[str, float]:
    base = [r[f"{path} baseline"][clients] for r in rounds]
    new = [r[path][clients] for r in rounds]
    rps_new, rps_base = (statistics.median(x["rps"] for x in xs) for xs in (new, base))
    return {
        "rps": round(rps_new, 1), "baseline_rps": round(rps_base, 1), "ratio_of_medians": round(rps_new / rps_base, 3),
        "median_paired_ratio": round(statistics.median(n["rps"] / b["rps"] for n, b in zip(new, base)), 3),
        "cpu_us": statistics.median(x["cpu_us"] for x in new), "baseline_cpu_us": statistics.median(x["cpu_us"] for x in base),
    }


if __name__ == "__main__":
    rounds_given = "--rounds" in sys.argv  # (an option of this script's own: the others take the common ones)
    n_rounds = int(sys.argv.pop(sys.argv.index("--rounds") + 1)) if rounds_given else 5
    if rounds_given:
        sys.argv.remove("--rounds")
    only = sys.argv.pop(sys.argv.index("--paths") + 1).split(",") if "--paths" in sys.argv else None  # (e.g. S9)
    if only is not None:
        sys.argv.remove("--paths")
    args = parse_args(__doc__, baseline=True)
    if not args.baseline_tree:
        raise SystemExit("--baseline-tree is required (git worktree add DIR REF)")
    paths = {"S2": (sim_config(latency_ms=10), S2_BODY), "S9": (standin_config("gpu_ms = 10"), S9_BODY)}
    paths = {name: path for name, path in paths.items() if only is None or name in only}
    rounds = []
    for n in range(1 if args.quick else n_rounds):
        one = {}
        for name, (config, body) in paths.items():
            # (which goes first swaps round by round: a server started second in a pair ran slower often
            # enough to read as a change)
            for tree in ((args.baseline_tree, None) if n % 2 == 0 else (None, args.baseline_tree)):
                one[name if tree is None else f"{name} baseline"] = measure(tree, config, body, args.quick)
        rounds.append(one)
    summary = {f"{name} {c} clients": summarise(rounds, name, c) for name in paths for c in CLIENTS}
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "request_path.json").write_text(json.dumps({"summary": summary, "rounds": rounds, "note": __doc__}, indent=2) + "\n")
    lines = ["### Request path: this checkout against the baseline, alternated", "",
             "| path | clients | req/s | baseline req/s | ratio of medians | median paired ratio | CPU µs/req | baseline CPU µs/req |",
             "|---|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        name, clients, _ = key.split()
        lines.append(f"| {name} | {clients} | {s['rps']:,.0f} | {s['baseline_rps']:,.0f} | {s['ratio_of_medians']} | "
                     f"{s['median_paired_ratio']} | {s['cpu_us']} | {s['baseline_cpu_us']} |")
    (out / "request_path.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
