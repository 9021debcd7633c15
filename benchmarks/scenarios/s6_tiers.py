"""S6, tiers under overload: S1's model offered mixed traffic (70% free, 25% paid, 5% enterprise) at 1x,
2x and 3x its capacity of 1,000 req/s. Per tier: achieved throughput, p50/p99 of admitted requests,
share shed. Free is refused past 150 ms of predicted wait, paid past 600 ms, enterprise only when its
own deadline cannot be met.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from pathlib import Path

import aiohttp
from common import inferd_server, parse_args, sim_config

from inferd.bench.runner import percentile

KEYS = {"enterprise": "s6-enterprise-key", "paid": "s6-paid-key", "free": "s6-free-key"}
MIX = (("free", 0.70), ("paid", 0.25), ("enterprise", 0.05))


def config() -> str:
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


if __name__ == "__main__":
    args = parse_args(__doc__)
    duration, warmup = (4, 1) if args.quick else (20, 3)
    steps = []
    for multiple in (1, 2, 3):
        with inferd_server(config()) as url:
            per_tier = asyncio.run(mixed_load(url, 1000 * multiple, duration, warmup))
        steps.append({"offered_rps": 1000 * multiple, "multiple_of_capacity": multiple, "tiers": per_tier})
        print(f"{multiple}x:", json.dumps(per_tier))
    lines = ["### S6: tiers under overload (capacity 1,000 req/s; mix 70% free / 25% paid / 5% enterprise)", "",
             "| offered | tier | sent | achieved req/s | p50 ms | p99 ms | shed |", "|---|---|---|---|---|---|---|"]
    for step in steps:
        for tier in ("enterprise", "paid", "free"):
            t = step["tiers"][tier]
            lines.append(f"| {step['multiple_of_capacity']}x ({step['offered_rps']}/s) | {tier} | {t['sent']} | "
                         f"{t['achieved_rps']} | {t['p50_ms']} | {t['p99_ms']} | {t['shed_share'] * 100:.1f}% |")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S6.json").write_text(json.dumps({"steps": steps}, indent=2) + "\n")
    (out / "S6.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
