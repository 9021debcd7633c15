"""S11, a rollout under load: v1 serves; v2 is loaded beside it, takes a 10% canary, then all traffic,
and v1 is drained and unloaded, all while open-loop Poisson load runs (the seed's simulated GPU, 50 ms
per batch of up to 32, about 40% of its capacity; a tenth of requests pinned to v1 while it is there,
a tenth to v2 once it is ready).

Every answer is checked: 200, the version in its X-Model-Version computed it (each version's outputs
carry its tag), and a pinned request got its version. The timeline plot shows answers per second by
version and the p99 latency per second, with the moments of load, canary, switch and unload marked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import _machine, inferd_server, parse_args

from inferd.backends.sim import expected_output

ADMIN_KEY = "s11-admin"
RATE = 250.0
CONFIG = f"""
[server]
access_log = "off"

[auth]
anonymous_tier = "default"
admin_key_sha256 = "{hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}"

[[models]]
name = "m"
backend = "inferd.backends.sim:create"
max_batch_size = 32
max_wait_ms = 10
[models.options]
latency_ms = 50
max_batch_size = 32
tag = "v1:"
"""
V2 = {"name": "m", "version": "2", "backend": "inferd.backends.sim:create", "max_batch_size": 32, "max_wait_ms": 10,
      "options": {"latency_ms": 50, "max_batch_size": 32, "tag": "v2:"}}


async def rollout(url: str, phase_s: float) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    answers: list[dict[str, Any]] = []
    events: dict[str, float] = {}
    pinned = {"1": True, "2": False}
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        began = time.monotonic()

        async def one(i: int, version: str | None) -> None:
            text = f"request {i}"
            sent = time.monotonic()
            body = {"input": text, "timeout_ms": 5000, **({"version": version} if version else {})}
            try:
                async with http.post(f"{url}/v1/inference", json=body) as resp:
                    status, data, served = resp.status, await resp.json(), resp.headers.get("X-Model-Version")
            except aiohttp.ClientError:
                status, data, served = 0, {}, None
            right = status == 200 and data.get("output") == f"v{served}:" + expected_output(text) and (
                version is None or served == version)
            answers.append({"t": sent - began, "latency_ms": (time.monotonic() - sent) * 1000, "status": status,
                            "pinned": version, "version": served, "right": right})

        async def load() -> None:
            rng, tasks, i = random.Random(11), [], 0
            next_at = time.monotonic()
            while not stop.is_set():
                draw = rng.random()
                version = "1" if draw < 0.1 and pinned["1"] else "2" if draw < 0.2 and pinned["2"] else None
                tasks.append(asyncio.ensure_future(one(i, version)))
                i += 1
                next_at += rng.expovariate(RATE)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*tasks)

        async def call(method: str, path: str, body: Any = None) -> dict:
            async with http.request(method, f"{url}{path}", json=body, headers=admin) as resp:
                assert resp.status in (200, 202), await resp.text()
                return await resp.json()

        async def state(version: str) -> str:
            return (await call("GET", "/v1/admin/models"))["models"]["m"]["versions"][version]["state"]

        loading = asyncio.ensure_future(load())
        await asyncio.sleep(phase_s)
        events["load v2"] = time.monotonic() - began
        await call("POST", "/v1/admin/models", V2)
        while await state("2") != "ready":
            await asyncio.sleep(0.02)
        pinned["2"] = True
        events["canary 10%"] = time.monotonic() - began
        await call("PUT", "/v1/admin/models/m/traffic", {"1": 90, "2": 10})
        await asyncio.sleep(phase_s)
        events["all to v2"] = time.monotonic() - began
        await call("PUT", "/v1/admin/models/m/traffic", {"2": 1})
        await asyncio.sleep(phase_s)
        pinned["1"] = False
        await asyncio.sleep(0.2)
        events["unload v1"] = time.monotonic() - began
        await call("DELETE", "/v1/admin/models/m/versions/1")
        while await state("1") != "unloaded":
            await asyncio.sleep(0.02)
        events["v1 unloaded"] = time.monotonic() - began
        await asyncio.sleep(phase_s)
        stop.set()
        await loading
    return {"answers": answers, "events": events}


def p99(values: list[float]) -> float | None:
    return round(sorted(values)[int(0.99 * (len(values) - 1))], 1) if values else None


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    answers, events = run["answers"], run["events"]
    steady = [a["latency_ms"] for a in answers if a["t"] < events["load v2"]]
    switching = [a["latency_ms"] for a in answers if events["load v2"] <= a["t"] < events["v1 unloaded"] + 1]
    return {
        "requests": len(answers), "not_200": sum(a["status"] != 200 for a in answers),
        "wrong_version_or_output": sum(not a["right"] for a in answers if a["status"] == 200),
        "by_version": {v: sum(a["version"] == v for a in answers) for v in ("1", "2")},
        "pinned": {v: sum(a["pinned"] == v for a in answers) for v in ("1", "2")},
        "p99_steady_ms": p99(steady), "p99_during_switch_ms": p99(switching),
        "p99_ratio": round(p99(switching) / p99(steady), 3) if steady and switching else None,  # type: ignore[operator]
        "events_s": {k: round(v, 3) for k, v in events.items()},
    }


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    answers, events = run["answers"], run["events"]
    seconds = list(range(int(max(a["t"] for a in answers))))  # (whole seconds only: the last one is cut short)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for version, colour in (("1", "tab:blue"), ("2", "tab:orange")):
        counts = [sum(1 for a in answers if int(a["t"]) == s and a["version"] == version) for s in seconds]
        top.plot(seconds, counts, label=f"answered by v{version}", color=colour)
    tails = [p99([a["latency_ms"] for a in answers if int(a["t"]) == s]) for s in seconds]
    bottom.plot(seconds, [t if t is not None else float("nan") for t in tails], color="black", label="p99, all")
    for i, (name, at) in enumerate(events.items()):
        for axis in (top, bottom):
            axis.axvline(at, color="grey", linestyle=":")
        top.text(at, top.get_ylim()[1] * (0.97 - 0.12 * (i % 2)), f" {name}", fontsize=8, va="top")
    top.set_ylabel("answers per second")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("p99 latency (ms)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds")
    top.legend(loc="center left")
    top.set_title(f"S11: a rollout at {RATE:.0f} req/s open loop (simulated GPU, 50 ms batches)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    args = parse_args(__doc__)
    with inferd_server(CONFIG) as url:
        run = asyncio.run(rollout(url, phase_s=2.0 if args.quick else 8.0))
    summary = summarise(run)
    out = Path(args.out_dir)
    (out / "S11.json").write_text(json.dumps({"meta": {"title": "S11: a rollout under load", "machine": _machine(),
                                                        "rate": RATE}, "summary": summary}, indent=1) + "\n")
    plot(run, out / "S11_timeline.png")
    lines = ["### S11: a rollout under load (v1 → 10% canary → 100% v2 → v1 unloaded)", "",
             "| requests | not 200 | wrong version or output | by v1 / v2 | pinned v1 / v2 | p99 steady ms | "
             "p99 during the switch ms | ratio |", "|---|---|---|---|---|---|---|---|",
             f"| {summary['requests']:,} | {summary['not_200']} | {summary['wrong_version_or_output']} | "
             f"{summary['by_version']['1']:,} / {summary['by_version']['2']:,} | "
             f"{summary['pinned']['1']:,} / {summary['pinned']['2']:,} | {summary['p99_steady_ms']} | "
             f"{summary['p99_during_switch_ms']} | {summary['p99_ratio']} |", "",
             f"events (s): {summary['events_s']}", "", "![timeline](S11_timeline.png)"]
    (out / "S11.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
