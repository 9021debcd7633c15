"""S14, how right the predicted wait is: open-loop Poisson arrivals at 80% and 150% of capacity, every
input distinct, 2 s deadlines, on the seed's function (50 ms a batch of up to 32, whatever its size) and
on the variable-cost sim (10 ms + 1.5 ms a request: 58 ms for 32), with 3% jitter (a GPU's spread) and
with 10% (a busy CPU's: a short wait then errs by the running batch's own noise). Each answer's
`Server-Timing` says how long it waited in the queue and what admission predicted when it queued it;
the figure is the p90 of |actual - predicted| / actual (over waits of at least 1 ms), beside the p90
of the absolute error.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
from common import RESULTS, inferd_server, parse_args

from inferd.bench.loadgen import open_loop

MODELS = {
    "seed's function": ("latency_ms = 50", 32 / 0.050),
    "variable cost, 3% jitter": ("latency_ms = 10\nper_item_ms = 1.5\njitter = 0.03\nseed = 1", 32 / 0.058),
    "variable cost, 10% jitter": ("latency_ms = 10\nper_item_ms = 1.5\njitter = 0.1\nseed = 1", 32 / 0.058),
}


def config(options: str) -> str:
    return f"""
[server]
access_log = "off"

[[models]]
name = "m"
backend = "inferd.backends.sim:create"
max_batch_size = 32
max_wait_ms = 5
max_queue = 4000
timeout_ms = 2000
[models.options]
max_batch_size = 32
{options}
"""


def timings(header: str) -> dict[str, float]:
    return {name.strip(): float(dur) for name, _, dur in (p.partition(";dur=") for p in header.split(",")) if dur}


async def measure(url: str, rate: float, seconds: float) -> dict:
    relative, absolute, statuses = [], [], {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def send(i: int, scheduled: float) -> None:
            try:
                async with session.post(f"{url}/v1/inference", json={"input": f"request {i}"}) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    timing = timings(resp.headers.get("Server-Timing", ""))
            except (aiohttp.ClientError, TimeoutError):
                statuses[0] = statuses.get(0, 0) + 1
                return
            if resp.status == 200 and "predicted_queue" in timing:
                error = abs(timing["queue"] - timing["predicted_queue"])
                absolute.append(error)
                if timing["queue"] >= 1.0:
                    relative.append(error / timing["queue"])

        await open_loop(rate, seconds, random.Random(int(rate)), send)
    relative.sort()
    absolute.sort()
    return {"rate": round(rate), "statuses": statuses, "answers_measured": len(absolute),
            "relative_error_p50": round(relative[len(relative) // 2], 3) if relative else None,
            "relative_error_p90": round(relative[int(0.9 * len(relative))], 3) if relative else None,
            "absolute_error_p90_ms": round(absolute[int(0.9 * len(absolute))], 2) if absolute else None}


if __name__ == "__main__":
    args = parse_args(__doc__)
    seconds = 4.0 if args.quick else 15.0
    results = {}
    for label, (options, capacity) in MODELS.items():
        with inferd_server(config(options)) as url:
            results[label] = [asyncio.run(measure(url, load * capacity, seconds)) | {"load": load} for load in (0.8, 1.5)]
    lines = ["### S14: predicted against actual queue wait (open loop, 2 s deadlines)", "",
             "| model | load | req/s offered | answers | p50 of |error| / actual | p90 of |error| / actual | p90 of |error| ms |",
             "|---|---|---|---|---|---|---|"]
    for label, rows in results.items():
        for r in rows:
            lines.append(f"| {label} | {int(r['load'] * 100)}% | {r['rate']} | {r['answers_measured']} | "
                         f"{100 * r['relative_error_p50']:.0f}% | {100 * r['relative_error_p90']:.0f}% | {r['absolute_error_p90_ms']} |")
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S14.json").write_text(json.dumps({"results": results, "note": __doc__}, indent=2) + "\n")
    (out / "S14.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
