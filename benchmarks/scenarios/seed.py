"""The seed's workload on the simulated GPU (100 ms per batch, batches up to 100, linger 20 ms), five ways:

- S1: one GPU. Ceiling 1,000 req/s, floor 100 ms. Closed loop (wrk) at 1, 100 and 400 clients, then an
  open-loop Poisson sweep drawn beside the ideal server's curve.
- S2: overhead, the seed's function at 10 ms a batch (ceiling 10,000 req/s): what the HTTP and batching
  path costs per request, throughput and the server's CPU µs per request at 100 and 400 closed-loop
  clients (wrk); then beside Mosec 0.9.8 (a Rust HTTP front and batcher feeding a Python worker process)
  running the same 10 ms sleep-and-uppercase worker, alternated twice; then the cost of observability:
  the same 400-client step with metrics and access logs (1% sampled) on, and with both off, alternated
  four times in one run.
- S3: a GPU host, eight simulated GPUs in one process. Ceiling 8,000 req/s. Closed loop at 800 and 1,600
  clients: 800 fill the eight batches exactly, 1,600 keep a full batch waiting for every GPU.
- S4: overload, S1 offered at 3x its ceiling (3,000 req/s, Poisson) for 60 s: achieved throughput, p99 of
  the admitted requests, the share answered 503, and the server's RSS every few seconds (it must stay
  flat). Nothing may hang or go unanswered: sent == answered.
- S6: tiers under overload, S1's model offered mixed traffic (70% free, 25% paid, 5% enterprise) at 1x,
  2x and 3x its capacity. Per tier: achieved throughput, p50/p99 of admitted requests, share shed. Free
  is refused past 150 ms of predicted wait, paid past 600 ms, enterprise only when its own deadline
  cannot be met.

`--scenario S1` (repeatable) runs one; the default, all five. Results: S1-S4 and S6 (S2 with S2_mosec and
S2_observability) in the results folder.
"""

import asyncio
import hashlib
import json
import random
import threading
import time
from pathlib import Path
from statistics import median

import aiohttp
from common import ideal_curve, inferd_server, measured_step, median_of, mosec_server, parse_args, save, sim_config, step

from inferd.bench.runner import fetch_stats, percentile

OPEN_RATES = [50, 200, 500, 800, 900, 950, 980]


def s1(quick: bool, out_dir: str) -> None:
    steps = []
    with inferd_server(sim_config(latency_ms=100)) as url:
        for clients in (1, 100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=quick))
        for rate in OPEN_RATES:
            steps.append(step(url, rate=rate, duration_s=10, quick=quick))
    save("S1", "S1: seed workload, 1 simulated GPU, 100 ms/batch, max batch 100", steps, out_dir,
         ceiling_rps=1000, floor_ms=100, ideal=ideal_curve(OPEN_RATES, 0.1, 100, 0.02))


OFF = 'metrics = false\naccess_log = "off"'


def s2(quick: bool, out_dir: str) -> None:
    steps = []
    with inferd_server(sim_config(latency_ms=10)) as url:
        for clients in (100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=quick, processes=2))
    save("S2", "S2: overhead, 1 simulated GPU, 10 ms/batch, max batch 100", steps, out_dir,
         ceiling_rps=10000, floor_ms=10)

    # Beside Mosec, alternated: this machine's speed drifts by 10-20% over minutes.
    versus: list[dict] = []
    with mosec_server(quick) as mosec:
        for _round in range(0 if mosec is None else 1 if quick else 2):
            with inferd_server(sim_config(latency_ms=10)) as url:
                for clients in (100, 400):
                    result = step(url, clients=clients, duration_s=10, quick=quick, processes=2)
                    versus.append({**result, "variant": "inferd"})
            for clients in (100, 400):
                result = measured_step(mosec[0], mosec[1], clients=clients, duration_s=10, quick=quick, path="/inference")
                versus.append({**result, "variant": "Mosec 0.9.8"})
    if versus:
        summary = {}
        for clients in (100, 400):
            ours = [s for s in versus if s["variant"] == "inferd" and s["offered"] == clients]
            theirs = [s for s in versus if s["variant"] != "inferd" and s["offered"] == clients]
            summary[f"{clients}_clients"] = {
                "inferd_rps": median_of(ours, "achieved_rps"), "mosec_rps": median_of(theirs, "achieved_rps"),
                "inferd_over_mosec": round(median_of(ours, "achieved_rps") / median_of(theirs, "achieved_rps"), 3),
                "inferd_cpu_us": median_of(ours, "cpu_us_per_request"), "mosec_cpu_us": median_of(theirs, "cpu_us_per_request"),
            }
        versus[-1]["summary"] = summary
        save("S2_mosec", "S2 beside Mosec 0.9.8: the same 10 ms worker, alternated", versus, out_dir,
             ceiling_rps=10000, plots=False)
        print(summary)

    # Four alternations: on this machine two runs of the same server differ by up to 20% in CPU.
    observability = []
    for _round in range(4):
        for label, extra in (("on", ""), ("off", OFF)):
            with inferd_server(sim_config(latency_ms=10, extra_server=extra)) as url:
                result = step(url, clients=400, duration_s=10, quick=quick, processes=2)
                result["observability"] = label
                result["variant"] = f"metrics + access log {label}"  # the table's first column
                observability.append(result)
    on = [s for s in observability if s["observability"] == "on"]
    off = [s for s in observability if s["observability"] == "off"]

    cpu_on = median([s["server"]["cpu_us_per_request"] for s in on])
    cpu_off = median([s["server"]["cpu_us_per_request"] for s in off])
    rps_on = median([s["achieved_rps"] for s in on])
    rps_off = median([s["achieved_rps"] for s in off])
    summary = {"cpu_us_on": cpu_on, "cpu_us_off": cpu_off, "cpu_ratio": round(cpu_on / cpu_off, 3),
               "rps_on": rps_on, "rps_off": rps_off, "rps_ratio": round(rps_on / rps_off, 3)}
    observability[-1]["summary"] = summary
    save("S2_observability", "S2 at 400 clients: metrics + access logs on vs off (alternated)", observability,
         out_dir, ceiling_rps=10000, floor_ms=10, plots=False)
    print(summary)


def s3(quick: bool, out_dir: str) -> None:
    steps = []
    with inferd_server(sim_config(latency_ms=100, workers=8, max_queue=8000)) as url:
        for clients in (800, 1600):
            steps.append(step(url, clients=clients, duration_s=10, quick=quick, processes=2))
    save("S3", "S3: GPU host, 8 simulated GPUs, 100 ms/batch, max batch 100", steps, out_dir,
         ceiling_rps=8000, floor_ms=100)


def s4(quick: bool, out_dir: str) -> None:
    with inferd_server(sim_config(latency_ms=100, max_queue=1000)) as url:
        rss: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            began = time.monotonic()
            while not stop.wait(5):
                stats = fetch_stats(f"{url}/v1/stats")
                if stats:
                    rss.append((round(time.monotonic() - began, 1), stats["process"]["rss_bytes"]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = step(url, rate=3000, duration_s=60, quick=quick, processes=2, warmup_s=0)
        stop.set()
        sampler.join()
    answered = sum(v for k, v in result["statuses"].items() if k.isdigit())
    result["overload"] = {
        "answered": answered,
        "unanswered": result["sent"] - answered,
        "share_503": round(result["statuses"].get("503", 0) / max(1, result["sent"]), 4),
        "ok_rps": result["ok_rps"],
        "rss_samples_bytes": rss,
    }
    save("S4", "S4: overload, S1 at 3x its ceiling (3,000 req/s offered)", [result], out_dir,
         ceiling_rps=1000, floor_ms=100)
    print(result["overload"])


# S6's tenants, one per tier, and the mix of tiers it offers
KEYS = {"enterprise": "s6-enterprise-key", "paid": "s6-paid-key", "free": "s6-free-key"}
MIX = (("free", 0.70), ("paid", 0.25), ("enterprise", 0.05))


def tiers_config() -> str:
    tenants = "".join(
        f'\n[[tenants]]\nname = "{tier}-tenant"\ntier = "{tier}"\nkey_sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
        for tier, key in KEYS.items()
    )
    return sim_config(latency_ms=100, max_queue=4000, extra_server='access_log = "off"') + f"""
[auth]
anonymous_tier = "free"

[tiers.enterprise]
[tiers.paid]
max_predicted_wait_ms = 600
[tiers.free]
max_predicted_wait_ms = 150
promote_after_ms = 2000
{tenants}"""


async def mixed_load(url: str, rate: float, duration_s: float, warmup_s: float) -> dict:
    rng = random.Random(int(rate))
    loop = asyncio.get_running_loop()
    samples: dict[str, list[tuple[float, int, float]]] = {tier: [] for tier, _ in MIX}

    async def one(session, tier, i, scheduled):
        headers = {"Authorization": f"Bearer {KEYS[tier]}"}
        try:
            async with session.post(f"{url}/v1/inference", json={"input": f"{tier} {i}"}, headers=headers) as resp:
                await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError):
            status = 0
        now = loop.time()
        samples[tier].append((scheduled, status, now - scheduled))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4000),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = []
        start = t = loop.time()
        i = 0
        while True:
            t += rng.expovariate(rate)
            if t - start > warmup_s + duration_s:
                break
            if t > loop.time():
                await asyncio.sleep(t - loop.time())
            r, tier = rng.random(), "free"
            for name, share in MIX[::-1]:
                if r < share:
                    tier = name
                    break
                r -= share
            tasks.append(asyncio.create_task(one(session, tier, i, t)))
            i += 1
        await asyncio.gather(*tasks)
    out = {}
    for tier, rows in samples.items():
        rows = [r for r in rows if r[0] - start >= warmup_s]  # scheduled after the warm-up
        ok = sorted(lat * 1000 for _, s, lat in rows if s == 200)
        out[tier] = {
            "sent": len(rows),
            "ok": len(ok),
            "achieved_rps": round(len(ok) / duration_s, 1),
            "p50_ms": round(percentile(ok, 50), 1) if ok else None,
            "p99_ms": round(percentile(ok, 99), 1) if ok else None,
            "shed_share": round(sum(1 for _, s, _ in rows if s == 503) / max(1, len(rows)), 3),
            "other": sum(1 for _, s, _ in rows if s not in (200, 503)),
        }
    return out


def s6(quick: bool, out_dir: str) -> None:
    duration, warmup = (4, 1) if quick else (20, 3)
    steps = []
    for multiple in (1, 2, 3):
        with inferd_server(tiers_config()) as url:
            per_tier = asyncio.run(mixed_load(url, 1000 * multiple, duration, warmup))
        steps.append({"offered_rps": 1000 * multiple, "multiple_of_capacity": multiple, "tiers": per_tier})
        print(f"{multiple}x:", json.dumps(per_tier))
    lines = ["### S6: tiers under overload (capacity 1,000 req/s; mix 70% free / 25% paid / 5% enterprise)", "",
             "| offered | tier | sent | achieved req/s | p50 ms | p99 ms | shed |", "|---|---|---|---|---|---|---|"]
    for load in steps:
        for tier in ("enterprise", "paid", "free"):
            t = load["tiers"][tier]
            lines.append(f"| {load['multiple_of_capacity']}x ({load['offered_rps']}/s) | {tier} | {t['sent']} | "
                         f"{t['achieved_rps']} | {t['p50_ms']} | {t['p99_ms']} | {t['shed_share'] * 100:.1f}% |")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S6.json").write_text(json.dumps({"steps": steps}, indent=2) + "\n")
    (out / "S6.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = parse_args(__doc__, scenarios=("S1", "S2", "S3", "S4", "S6"))
    for name in args.scenario:
        {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "S6": s6}[name](args.quick, args.out_dir)
