"""False refusals: of the requests admission refuses, how many would have met their deadline (issue 50).

The same open-loop load (seeded Poisson arrivals, distinct inputs, 1 s deadlines) is sent to three
servers in turn, one at a time: this tree (`new`), this tree with `refuse_early = false` (`off`:
deadlines only, a request is queued whatever its prediction and answered 504 if its deadline passes),
and, with --baseline-tree, an earlier checkout (`base`). Request i of one run is request i of the
others, so a request refused (503) by `new` or `base` whose twin `off` answered within its deadline is a
false refusal. At 50%, 100% and 150% of the workload's capacity, without and with CPU hogs beside the
server (`--hogs 1` and `--hogs 3`: busy processes per core, as other work on a shared host).

Workloads: `seed` (the seed's fixed-time batch, 100 ms for up to 24 inputs), `jitter` (the
variable-cost sim: 40 ms + 2 ms a request, 30% jitter), `minilm` (all-MiniLM-L6-v2 on this CPU,
single-input /v1/embeddings). Reported per step: share refused, false refusals (share of the refused
whose twin was answered in time, and by the second of the run: where they fall), share answered within
the deadline, p99 of answered. `--loads 1.5` (default 0.5,1.0,1.5): the loads to run, as shares of capacity;
`--seconds 60` (default 12): each run's length (the onset of overload, its first seconds, weighs less in a longer run).

`--closed ROUNDS`: the issue's own reproduction instead: MiniLM on ~400-token inputs, 8 closed-loop clients,
the default 10 s deadlines, `--closed-s` seconds a run, with the last of `--hogs` CPU hogs per core;
`new` and `base` in turn, alternated: the share refused beside the slowest answer.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import aiohttp
from common import RESULTS, inferd_server, own_option, parse_args, save_table, start_hogs, stop_hogs

from inferd.bench.loadgen import open_loop

DEADLINE_MS = 1000
WORKLOADS: dict[str, dict[str, Any]] = {
    "seed": {"capacity": 240.0, "path": "/v1/inference", "body": '{{"input": "seed {i}"}}', "model": """
backend = "inferd.backends.sim:create"
max_batch_size = 24
max_wait_ms = 20
[models.options]
latency_ms = 100
max_batch_size = 24
"""},
    "jitter": {"capacity": 220.0, "path": "/v1/inference", "body": '{{"input": "jitter {i}"}}', "model": """
backend = "inferd.backends.sim:create"
max_batch_size = 16
max_wait_ms = 10
[models.options]
latency_ms = 40
per_item_ms = 2
jitter = 0.3
max_batch_size = 16
"""},
    "minilm": {"capacity": 0.0, "path": "/v1/embeddings",  # (capacity measured first: it depends on the host)
               "body": '{{"model": "m", "input": "request {i}: a sentence of about a dozen words to embed"}}', "model": """
backend = "inferd.backends.transformer:create"
max_batch_size = 32
max_wait_ms = 5
[models.options]
max_tokens = 64
"""},
}


def config(workload: str, refuse_early: bool | None) -> str:
    early = "" if refuse_early is None else f"refuse_early = {'true' if refuse_early else 'false'}\n"
    return f"""
[server]
access_log = "off"
[[models]]
name = "m"
max_queue = 100000
timeout_ms = {DEADLINE_MS}
{early}{WORKLOADS[workload]["model"]}"""


async def offer(url: str, path: str, body: str, rate: float, seconds: float, seed: int) -> list[tuple[int, float]]:
    """Open-loop load: (status, latency ms from the scheduled send) of each request, by its index."""
    results: dict[int, tuple[int, float]] = {}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=DEADLINE_MS / 1000 + 10)) as session:
        async def send(i: int, scheduled: float) -> None:
            try:
                async with session.post(url + path, data=body.format(i=i).encode(),
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            results[i] = (status, (loop.time() - scheduled) * 1000)

        sent = await open_loop(rate, seconds, random.Random(seed), send)
    return [results.get(i, (0, 0.0)) for i in range(sent)]


def measure_capacity(url: str, path: str, body: str) -> float:
    """Answers per second at twice what it can take, deadlines off (for a model whose rate is the host's)."""
    rates = []
    for rate in (200.0, 400.0):
        outcomes = asyncio.run(offer(url, path, body, rate, 6.0, 1))
        rates.append(sum(1 for s, ms in outcomes if s == 200) / 6.0)
    return max(rates)


def summary(outcomes: list[tuple[int, float]], twin: list[tuple[int, float]] | None, rate: float) -> dict[str, Any]:
    """A run's figures; with its twin, the share of the refused the twin answered in time, and by the second
    of the run (a request's second read from its index at `rate`, the schedule's mean): where they fall."""
    n = len(outcomes)
    statuses = Counter(s for s, _ in outcomes)
    answered = sorted(ms for s, ms in outcomes if s == 200)
    in_time = sum(1 for s, ms in outcomes if s == 200 and ms <= DEADLINE_MS)
    refused = [i for i, (s, _) in enumerate(outcomes) if s == 503]
    row: dict[str, Any] = {
        "sent": n, "refused_share": round(len(refused) / n, 4) if n else None,
        "in_time_share": round(in_time / n, 4) if n else None,
        "p99_ms": round(answered[min(len(answered) - 1, int(0.99 * len(answered)))], 1) if answered else None,
        "statuses": dict(statuses),
    }
    if twin is not None and refused:
        twin_in_time = [s == 200 and ms <= DEADLINE_MS for s, ms in twin]
        would_have_met = sum(1 for i in refused if i < len(twin) and twin_in_time[i])
        row["false_refusal_share"] = round(would_have_met / len(refused), 4)
        row["really_missed_share"] = round(1 - would_have_met / len(refused), 4)
        by_second: dict[int, list[int]] = {}  # second -> [sent, twin in time, refused, refused and twin in time]
        for i, (status, _) in enumerate(outcomes):
            counts = by_second.setdefault(int(i / rate), [0, 0, 0, 0])
            met = i < len(twin) and twin_in_time[i]
            counts[0] += 1
            counts[1] += met
            if status == 503:
                counts[2] += 1
                counts[3] += met
        row["by_second"] = [[second, *counts] for second, counts in sorted(by_second.items())]
    return row


LONG_BODY = ('{{"model": "m", "input": "request {i}: ' + " ".join(f"word{k} of a long passage" for k in range(65)) + '"}}')
MINILM_LONG = """
backend = "inferd.backends.transformer:create"
max_batch_size = 32
max_wait_ms = 5
[models.options]
max_tokens = 512
"""


async def closed_loop(url: str, clients: int, seconds: float) -> list[tuple[int, float]]:
    """`clients` each sending its next request when the last returns: (status, latency ms) of each."""
    results: list[tuple[int, float]] = []
    loop = asyncio.get_running_loop()
    counter = iter(range(10**9))
    end = loop.time() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client() -> None:
            while loop.time() < end:
                began = loop.time()
                try:
                    async with session.post(url + "/v1/embeddings", data=LONG_BODY.format(i=next(counter)).encode(),
                                            headers={"Content-Type": "application/json"}) as resp:
                        await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                results.append((status, (loop.time() - began) * 1000))
        await asyncio.gather(*(client() for _ in range(clients)))
    return results


def closed_main(args: Any, seconds: float, rounds: int, hogs_per_core: int) -> None:
    """The issue's reproduction: MiniLM, long inputs, 8 closed-loop clients, 10 s deadlines, CPU hogs."""
    variants = [("new", None)] + ([("base", args.baseline_tree)] if args.baseline_tree else [])
    rows = []
    for round_ in range(rounds):
        for name, tree in variants if round_ % 2 == 0 else variants[::-1]:
            config = f'[server]\naccess_log = "off"\n[[models]]\nname = "m"\n{MINILM_LONG}'
            with inferd_server(config, **({"tree": tree} if tree else {})) as url:
                hogs = start_hogs(hogs_per_core)
                try:
                    outcomes = asyncio.run(closed_loop(url, 8, seconds))
                finally:
                    stop_hogs(hogs)
            answered = [ms for s, ms in outcomes if s == 200]
            row = {"round": round_ + 1, "variant": name, "hogs_per_core": hogs_per_core, "requests": len(outcomes),
                   "refused_share": round(sum(1 for s, _ in outcomes if s == 503) / max(1, len(outcomes)), 4),
                   "slowest_answer_ms": round(max(answered), 1) if answered else None,
                   "statuses": dict(Counter(s for s, _ in outcomes))}
            rows.append(row)
            print(row, flush=True)
    lines = ["| round | hogs/core | variant | requests | refused | slowest answered ms | statuses |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['hogs_per_core']} | {r['variant']} | {r['requests']} | {r['refused_share']:.1%} | "
              f"{r['slowest_answer_ms']} | {r['statuses']} |" for r in rows]
    title = (f"False refusals, the issue's case: MiniLM on ~400-token inputs (CPU), 8 closed-loop clients, 10 s "
             f"deadlines, {hogs_per_core} CPU hog(s) per core, {seconds:.0f} s a run")
    save_table("false_refusals_closed", title, rows, lines, args.out_dir or RESULTS)


def main() -> None:
    workloads = (own_option("--workloads") or "seed,jitter").split(",")
    hog_levels = [int(h) for h in (own_option("--hogs") or "0,1").split(",")]
    closed, closed_s = own_option("--closed"), float(own_option("--closed-s") or 30)
    loads = [float(load) for load in (own_option("--loads") or "0.5,1.0,1.5").split(",")]
    seconds_option = own_option("--seconds")
    args = parse_args(__doc__ or "", baseline=True)
    if closed is not None:
        closed_main(args, closed_s, int(closed), hog_levels[-1])
        return
    seconds = float(seconds_option) if seconds_option else 6.0 if args.quick else 12.0
    variants: list[tuple[str, bool | None, Any]] = [("off", False, None), ("new", True, None)]
    if args.baseline_tree:
        variants.append(("base", None, args.baseline_tree))
    steps = []
    for workload in workloads:
        spec = WORKLOADS[workload]
        capacity = spec["capacity"]
        if not capacity:
            with inferd_server(config(workload, False)) as url:
                capacity = measure_capacity(url, spec["path"], spec["body"])
            print(f"{workload}: capacity {capacity:.0f} answers/s", flush=True)
        for hogs in hog_levels:
            for load in loads:
                rate = load * capacity
                seed = int(load * 100) + hogs
                runs: dict[str, list[tuple[int, float]]] = {}
                hog_procs = start_hogs(hogs) if hogs else []
                try:
                    for name, refuse_early, tree in variants:
                        kw = {"tree": tree} if tree else {}
                        with inferd_server(config(workload, refuse_early), **kw) as url:
                            asyncio.run(offer(url, spec["path"], spec["body"], rate / 4, 2.0, 999))  # warm-up
                            time.sleep(0.5)
                            runs[name] = asyncio.run(offer(url, spec["path"], spec["body"], rate, seconds, seed))
                finally:
                    stop_hogs(hog_procs)
                for name, _, _ in variants:
                    row = {"workload": workload, "hogs_per_core": hogs, "load": load, "rate": round(rate, 1),
                           "variant": name, **summary(runs[name], runs["off"] if name != "off" else None, rate)}
                    steps.append(row)
                    print(row, flush=True)
    lines = ["| workload | hogs/core | load | variant | refused | of the refused, would have met (twin `off`) | answered in time "
             "| p99 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in steps:
        false = r.get("false_refusal_share")
        lines.append(f"| {r['workload']} | {r['hogs_per_core']} | {r['load']:.0%} | {r['variant']} | {r['refused_share']:.1%} | "
                     f"{'' if false is None else f'{false:.1%}'} | {r['in_time_share']:.1%} | {r['p99_ms']} |")
    split = [r for r in steps if r.get("by_second") and r["refused_share"]]
    if split:
        lines += ["", "Refused (of them, answered in time by the twin `off`) in each second of the run, by arrival:", ""]
        lines += [f"- {r['workload']}, {r['hogs_per_core']} hogs/core, {r['load']:.0%}, {r['variant']}: "
                  + ", ".join(f"{second}: {refused} ({false})" for second, _, _, refused, false in r["by_second"])
                  for r in split]
    title = (f"False refusals: open loop, {DEADLINE_MS} ms deadlines, {seconds:.0f} s a run; `new` this tree, "
             "`off` deadlines only (refuse_early = false), `base` the baseline tree")
    save_table("false_refusals", title, steps, lines, args.out_dir or RESULTS)


if __name__ == "__main__":
    main()
