"""Soak: S1 load with random hangs and poison inputs, counting that every request is answered exactly once.

Not part of the test suite (it runs for minutes). Open-loop Poisson load at --rate for --duration
seconds against inferd serving the faulty simulated GPU (100 ms per batch, batches up to 100): a share
of batches hang for `hang_s` (the watchdog replaces the worker), and a share of inputs carry a poison
marker (isolated by bisection, answered 500). Each request has a unique X-Request-ID; every answer is
checked against its own input. Results go to benchmarks/results/soak_faults.json.

    .venv/bin/python benchmarks/soak_faults.py --duration 300 --rate 700
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent / "scenarios"))
from common import RESULTS, inferd_server  # noqa: E402

from inferd.backends.sim import expected_output  # noqa: E402
from inferd.bench.loadgen import open_loop  # noqa: E402

CONFIG = """
[server]
access_log = "off"

[[models]]
name = "batchstring"
backend = "inferd.backends.faulty:create"
max_batch_size = 100
max_wait_ms = 20
workers = 2
max_queue = 4000
timeout_ms = 20000
batch_timeout_ms = 400
max_batch_attempts = 3
[models.options]
latency_ms = 100
max_batch_size = 100
fail_marker = "POISON"
hang_probability = {hang_probability}
hang_s = 3
seed = 11
"""


async def soak(url: str, rate: float, duration_s: float, poison_share: float) -> dict:
    tally: Counter[str] = Counter()
    wrong: list[str] = []
    rng = random.Random(5)
    async def one(session: aiohttp.ClientSession, i: int) -> None:
        poison = rng.random() < poison_share
        text = f"{'POISON ' if poison else ''}soak {i}"
        rid = f"soak-{i}"
        try:
            async with session.post(f"{url}/v1/inference", json={"input": text}, headers={"X-Request-ID": rid}) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            tally[f"no_answer:{type(exc).__name__}"] += 1
            return
        tally[str(status)] += 1
        if body.get("request_id") != rid:
            wrong.append(f"{rid}: answered as {body.get('request_id')}")
        elif status == 200 and (poison or body["output"] != expected_output(text)):
            wrong.append(f"{rid}: wrong output")
        elif status == 500 and not poison:
            tally["500_not_poison"] += 1
        elif poison and status == 200:
            wrong.append(f"{rid}: poison answered 200")

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=3000)) as session:
        i = await open_loop(rate, duration_s, rng, lambda i, _: one(session, i))
    answered = sum(v for k, v in tally.items() if k.isdigit())
    return {"sent": i, "answered": answered, "unanswered": i - answered, "wrong": len(wrong),
            "wrong_examples": wrong[:10], "statuses": dict(tally)}


def server_counts(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    answered = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("inferd_requests_total{") and 'model="batchstring"' in line)
    replaced = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=10))["data"][0]["workers_replaced"]
    return {"server_answered": int(answered), "workers_replaced": replaced}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300)
    parser.add_argument("--rate", type=float, default=700)
    parser.add_argument("--hang-probability", type=float, default=0.005, help="per batch")
    parser.add_argument("--poison-share", type=float, default=0.002, help="per input")
    parser.add_argument("--out", default=str(RESULTS / "soak_faults.json"))
    args = parser.parse_args()
    started = time.monotonic()
    with inferd_server(CONFIG.format(hang_probability=args.hang_probability)) as url:
        result = asyncio.run(soak(url, args.rate, args.duration, args.poison_share))
        result.update(server_counts(url))
    result.update(duration_s=args.duration, rate=args.rate, hang_probability=args.hang_probability,
                  poison_share=args.poison_share, wall_s=round(time.monotonic() - started, 1))
    result["exactly_once"] = result["unanswered"] == 0 and result["wrong"] == 0 and result["server_answered"] == result["sent"]
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    sys.exit(0 if result["exactly_once"] else 1)


if __name__ == "__main__":
    main()
