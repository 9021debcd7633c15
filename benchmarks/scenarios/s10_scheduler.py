"""S10, the scheduler: mixed length buckets, tiers and tenants above capacity.

One simulated GPU at 50 ms per batch of up to 32 (capacity ~640 req/s), `max_wait_ms = 5`, inputs over
50 characters in a second length bucket (`two_buckets.py`), open-loop Poisson load per class of traffic,
each request with a 2 s deadline (40 batch times). Reported per class: served, 503, 504, p50/p99.
- buckets: 90% short, 10% long inputs at 80, 105, 120 and 200% of capacity;
- tiers: enterprise sends long inputs, free sends short ones (no wait limit), at 120 and 200%;
- tenants: two tenants of one tier (wait limit 150 ms), one sending ten times the other, at 150%;
- predicted wait: free (limit 150 ms) beside enterprise at 200%: does "refused past 150 ms" hold?
- one client, closed loop: a lone request should not pay the linger.
Then the buckets and tiers steps again with a latency objective, `slo_ms = 300`: goodput (answers
within 300 ms, per second), the server's own time for its refusals (`Server-Timing: total` of each
503) and how far the predicted queue wait was from the actual one (`Server-Timing`, each answer).
With --baseline-tree, the same on an earlier checkout in the same run.

`--tier-objective N` runs one step instead, N times on a fresh server each (the arrival rates learned
during it): enterprise's long inputs with a tier objective of its own (`[tiers.enterprise] slo_ms = 200`,
the model's 300) at 30% of capacity beside free's short ones, 200% in all; the p99 at the server of what
each tier was served against its objective, to `S10_tier_objective.{md,json}`. With `--load L` (a share
of capacity, 2.0 unless given), at that load instead, enterprise still 15% of it, and with `--model-slo-ms M`
the model's objective M (free's; 300 unless given), to `S10_tier_objective_{L x 100}[_{M}].{md,json}`: at light
load free's partial batches linger most of their objective, and enterprise's batches must go by its own.

`--mixed-deadlines N` runs one step, N times on a fresh server each: one client at 5% of capacity under the
model's objective of 1 s (`--load`, `--model-slo-ms` as above), a quarter of its requests sent with
`"timeout_ms": 300`: their batches must go by their deadlines, though the requests ahead of them in the same
client's queue could linger most of a second; to `S10_mixed_deadlines.{md,json}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import aiohttp
from common import RESULTS, inferd_server, own_option, parse_args

from inferd.bench.loadgen import open_loop

CAPACITY = 640.0
SHORT, LONG = "short {i}", "a long input, well over fifty characters, in the second bucket {i}"
KEYS = {"acme": "key-acme", "free": "key-free", "heavy": "key-heavy", "light": "key-light"}


SLO_MS = 300
TIER_SLO_MS = 200


def config(tiers: str = "", slo_ms: int | None = None) -> str:
    tenants = "".join(f'\n[[tenants]]\nname = "{n}"\ntier = "{t}"\nkey_sha256 = "{hashlib.sha256(KEYS[n].encode()).hexdigest()}"\n'
                      for n, t in (("acme", "enterprise"), ("free", "free"), ("heavy", "paid"), ("light", "paid")))
    return f"""
[server]
access_log = "off"
{'[auth]' + chr(10) + 'anonymous_tier = "free"' if tiers else ''}
[[models]]
name = "m"
backend = "two_buckets:create"
max_batch_size = 32
max_wait_ms = 5
max_queue = 2000
timeout_ms = 2000
{f"slo_ms = {slo_ms}" if slo_ms else ""}
[models.options]
latency_ms = 50
max_batch_size = 32
{tiers}
{tenants if tiers else ''}
"""


TIERS = """
[tiers.enterprise]
[tiers.paid]
max_predicted_wait_ms = 150
[tiers.free]
{free}
"""


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def timings(header: str) -> dict[str, float]:
    """Server-Timing's durations by name (ms)."""
    return {name.strip(): float(dur) for name, _, dur in (p.partition(";dur=") for p in header.split(",")) if dur}


def pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None


async def offered(url: str, classes: dict[str, tuple[float, str, dict[str, str]]], seconds: float,
                  objective_ms: int = SLO_MS, bodies: dict[str, dict] | None = None) -> dict[str, dict]:
    """Each class's open-loop stream: (rate, input template, headers); `bodies`: a class's other body fields."""
    stats = {name: {"lat": [], "status": Counter(), "refusal_ms": [], "prediction_error": [], "server_ms": []}
             for name in classes}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def stream(name: str, rate: float, template: str, headers: dict[str, str]) -> None:
            extra = (bodies or {}).get(name, {})

            async def send(i: int, scheduled: float) -> None:
                try:
                    async with session.post(f"{url}/v1/inference", json={"input": template.format(i=i), **extra},
                                            headers=headers) as resp:
                        body = await resp.read()
                        status = resp.status
                        timing = timings(resp.headers.get("Server-Timing", ""))
                    if status == 200:
                        stats[name]["server_ms"].append(json.loads(body)["latency_ms"])
                    if status == 503 and "total" in timing:
                        stats[name]["refusal_ms"].append(timing["total"])
                    if status == 200 and "predicted_queue" in timing and timing["queue"] >= 1.0:
                        actual = timing["queue"]  # (relative error of waits under a millisecond says nothing)
                        stats[name]["prediction_error"].append(abs(actual - timing["predicted_queue"]) / actual)
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                stats[name]["status"][status] += 1
                if status == 200:
                    stats[name]["lat"].append((loop.time() - scheduled) * 1000)

            await open_loop(rate, seconds, random.Random(name), send)

        await asyncio.gather(*(stream(n, *spec) for n, spec in classes.items()))
    out = {}
    for name, s in stats.items():
        lat, st = sorted(s["lat"]), s["status"]
        total = sum(st.values())
        out[name] = {"sent": total, "served": st[200], "503": st[503], "504": st[504], "other": total - st[200] - st[503] - st[504],
                     "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "server_p99_ms": pct(s["server_ms"], 0.99),
                     "goodput_rps": round(sum(1 for x in lat if x <= SLO_MS) / seconds, 1),
                     "refusal_server_p99_ms": pct(s["refusal_ms"], 0.99),
                     "prediction_error_p90": pct(s["prediction_error"], 0.9),
                     "server_over_ms": {ms: sum(1 for x in s["server_ms"] if x > ms) for ms in {TIER_SLO_MS, SLO_MS, objective_ms}}}
    return out


def one_client(url: str, seconds: float) -> dict:
    import urllib.request

    latencies, end = [], time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        started = time.monotonic()
        request = urllib.request.Request(f"{url}/v1/inference", data=json.dumps({"input": f"alone {i}"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
        latencies.append((time.monotonic() - started) * 1000)
        i += 1
    latencies.sort()
    return {"requests": len(latencies), "p50_ms": round(latencies[len(latencies) // 2], 1)}


def run_with_objective(tree, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    """The buckets and tiers steps with `slo_ms = 300`."""
    kw = {"tree": tree} if tree else {}
    rows: dict = {}
    with inferd_server(config(slo_ms=SLO_MS), **kw) as url:
        for load in (0.8, 1.2, 2.0):
            rows[f"buckets {int(load * 100)}%"] = asyncio.run(offered(
                url, {"short": (0.9 * load * CAPACITY, SHORT, {}), "long": (0.1 * load * CAPACITY, LONG, {})}, seconds))
    with inferd_server(config(TIERS.format(free=""), slo_ms=SLO_MS), **kw) as url:
        for load in (1.2, 2.0):
            rows[f"tiers {int(load * 100)}%"] = asyncio.run(offered(url, {
                "enterprise-long": (0.3 * CAPACITY, LONG, bearer("acme")),
                "free-short": ((load - 0.3) * CAPACITY, SHORT, bearer("free"))}, seconds))
    return rows


def tier_objective(tree, seconds: float, runs: int, load: float = 2.0, model_slo_ms: int = SLO_MS) -> list[dict]:  # type: ignore[no-untyped-def]
    """Enterprise with its own objective at `load` of capacity (15% of it), `runs` times on a fresh server."""
    kw = {"tree": tree} if tree else {}
    tiers = TIERS.format(free="").replace("[tiers.enterprise]\n", f"[tiers.enterprise]\nslo_ms = {TIER_SLO_MS}\n")
    rows = []
    for _ in range(runs):
        with inferd_server(config(tiers, slo_ms=model_slo_ms), **kw) as url:
            rows.append(asyncio.run(offered(url, {"enterprise-long": (0.15 * load * CAPACITY, LONG, bearer("acme")),
                                                  "free-short": (0.85 * load * CAPACITY, SHORT, bearer("free"))}, seconds,
                                            model_slo_ms)))
    return rows


def mixed_deadlines(tree, seconds: float, runs: int, load: float, model_slo_ms: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """One client's requests at `load` of capacity, a quarter with a 300 ms deadline, `runs` times on a fresh server."""
    kw = {"tree": tree} if tree else {}
    rows = []
    for _ in range(runs):
        with inferd_server(config(slo_ms=model_slo_ms), **kw) as url:
            rows.append(asyncio.run(offered(url, {"default deadline": (0.75 * load * CAPACITY, SHORT, {}),
                                                  "300 ms deadline": (0.25 * load * CAPACITY, SHORT, {})},
                                            seconds, model_slo_ms, bodies={"300 ms deadline": {"timeout_ms": 300}})))
    return rows


def write_mixed_deadlines(results: dict[str, list[dict]], out: Path, load: float, model_slo_ms: int) -> None:
    lines = [f"### S10, one client's mixed deadlines at {load:.0%} of capacity (the model's objective {model_slo_ms} ms; "
             "a fresh server each run)", "",
             "| checkout | run | class | sent | served | 503 | 504 | p50 ms | p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for label, runs in results.items():
        for i, row in enumerate(runs, 1):
            for name, c in row.items():
                lines.append(f"| {label} | {i} | {name} | {c['sent']} | {c['served']} | {c['503']} | {c['504']} | "
                             f"{c['p50_ms']} | {c['p99_ms']} |")
    (out / "S10_mixed_deadlines.json").write_text(json.dumps({"results": results, "load": load, "model_slo_ms": model_slo_ms,
                                                             "note": __doc__}, indent=2) + "\n")
    (out / "S10_mixed_deadlines.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_tier_objective(results: dict[str, list[dict]], out: Path, load: float = 2.0, model_slo_ms: int = SLO_MS) -> None:
    objective = {"enterprise-long": TIER_SLO_MS, "free-short": model_slo_ms}
    lines = [f"### S10, a tier's own objective at {load:.0%} of capacity (enterprise `slo_ms = {TIER_SLO_MS}`, the model's "
             f"{model_slo_ms}; a fresh server each run)", "",
             "| checkout | run | class | objective ms | sent | served | 503 | 504 | p99 ms at the server | "
             "served past the objective at the server | p99 ms at the client |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, runs in results.items():
        for i, row in enumerate(runs, 1):
            for name, c in row.items():
                late = c["server_over_ms"][objective[name]]
                lines.append(f"| {label} | {i} | {name} | {objective[name]} | {c['sent']} | {c['served']} | {c['503']} | "
                             f"{c['504']} | {c['server_p99_ms']} | {late} ({100 * late / max(1, c['served']):.2f}%) | "
                             f"{c['p99_ms']} |")
    stem = "S10_tier_objective" if load == 2.0 else f"S10_tier_objective_{load * 100:.0f}"
    stem += "" if model_slo_ms == SLO_MS else f"_{model_slo_ms}"
    (out / f"{stem}.json").write_text(json.dumps({"results": results, "load": load, "note": __doc__}, indent=2) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_all(tree, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    kw = {"tree": tree} if tree else {}
    rows: dict = {}
    with inferd_server(config(), **kw) as url:
        for load in (0.8, 1.05, 1.2, 2.0):
            rows[f"buckets {int(load * 100)}%"] = asyncio.run(offered(
                url, {"short": (0.9 * load * CAPACITY, SHORT, {}), "long": (0.1 * load * CAPACITY, LONG, {})}, seconds))
        rows["one client"] = one_client(url, seconds)
    with inferd_server(config(TIERS.format(free="")), **kw) as url:
        for load in (1.2, 2.0):
            rows[f"tiers {int(load * 100)}%"] = asyncio.run(offered(url, {
                "enterprise-long": (0.3 * CAPACITY, LONG, bearer("acme")),
                "free-short": ((load - 0.3) * CAPACITY, SHORT, bearer("free"))}, seconds))
        rows["tenants 150%"] = asyncio.run(offered(url, {
            "heavy": (1.5 * CAPACITY * 10 / 11, SHORT, bearer("heavy")),
            "light": (1.5 * CAPACITY / 11, SHORT, bearer("light"))}, seconds))
    with inferd_server(config(TIERS.format(free="max_predicted_wait_ms = 150")), **kw) as url:
        rows["predicted wait 200%"] = asyncio.run(offered(url, {
            "enterprise": (0.6 * CAPACITY, SHORT, bearer("acme")),
            "free (limit 150 ms)": (1.4 * CAPACITY, SHORT, bearer("free"))}, seconds))
    return rows


def table(label: str, rows: dict) -> str:
    lines = [f"#### {label}", "", "| step | class | sent | served | 503 | 504 | p50 ms | p99 ms | p99 ms at the server | "
             "within 300 ms /s | 503 at the server, p99 ms | queue prediction error, p90 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for step, classes in rows.items():
        if step == "one client":
            lines.append(f"| one client, closed loop | - | {classes['requests']} | {classes['requests']} | 0 | 0 | "
                         f"{classes['p50_ms']} | - | | | | |")
            continue
        for name, c in classes.items():
            error = c.get("prediction_error_p90")
            lines.append(f"| {step} | {name} | {c['sent']} | {c['served']} | {c['503']} | {c['504']} | {c['p50_ms']} | {c['p99_ms']} | "
                         f"{c.get('server_p99_ms') or ''} | {c.get('goodput_rps', '')} | {c.get('refusal_server_p99_ms') or ''} | "
                         f"{'' if error is None else f'{100 * error:.0f}%'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    tier_runs = int(own_option("--tier-objective") or 0)
    mixed_runs = int(own_option("--mixed-deadlines") or 0)
    load = float(own_option("--load") or (0.05 if mixed_runs else 2.0))
    model_slo_ms = int(own_option("--model-slo-ms") or (1000 if mixed_runs else SLO_MS))
    args = parse_args(__doc__, baseline=True)
    seconds = 3.0 if args.quick else 10.0
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    if mixed_runs or tier_runs:  # one step, beside the baseline's
        step, write = (mixed_deadlines, write_mixed_deadlines) if mixed_runs else (tier_objective, write_tier_objective)
        options = (seconds, mixed_runs or tier_runs, load, model_slo_ms)
        stepped = {"inferd": step(None, *options)}
        if args.baseline_tree:
            stepped["unchanged main"] = step(args.baseline_tree, *options)
        write(stepped, out, load, model_slo_ms)
        raise SystemExit(0)
    results = {"inferd": run_all(None, seconds), f"inferd, slo_ms = {SLO_MS}": run_with_objective(None, seconds)}
    if args.baseline_tree:
        results["unchanged main"] = run_all(args.baseline_tree, seconds)
        results[f"unchanged main, slo_ms = {SLO_MS}"] = run_with_objective(args.baseline_tree, seconds)
    (out / "S10.json").write_text(json.dumps({"results": results, "note": __doc__}, indent=2) + "\n")
    text = "### S10: buckets, tiers and tenants above capacity (50 ms batches of up to 32, capacity ~640 req/s)\n\n"
    text += "\n".join(table(label, rows) for label, rows in results.items())
    (out / "S10.md").write_text(text)
    print(text)
