"""Mixed traffic on a real server process: single requests (some repeated: collapsed or cached) beside a
paid tenant's 1-3-row calls. Before its fix this stopped the model for good within seconds: a short
call taken out of turn left a spent entry in its tenant's queue, the queue's fast path read it as a
request, and every worker (and every replacement, hundreds a minute) died taking the next batch, while
`/readyz` said ready and every later request got 504."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time

import aiohttp

from inferd.backends.sim import expected_output

from ..helpers import PYTHON, ServerProcess, write_config

KEY = "soak-paid-key"
CONFIG = f"""
[server]
host = "127.0.0.1"
port = 0
access_log = "off"

[auth]
anonymous_tier = "free"

[tiers.paid]
[tiers.free]

[[tenants]]
name = "acme"
tier = "paid"
key_sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"

[[models]]
name = "sim"
backend = "inferd.backends.sim:create"
max_batch_size = 64
max_wait_ms = 5
timeout_ms = 5000
cache_bytes = 4194304
[models.options]
latency_ms = 30
max_batch_size = 64
"""
LOAD_S = 8.0


async def single_client(http: aiohttp.ClientSession, url: str, who: int, until: float, wrong: list[str]) -> int:
    answered = 0
    i = 0
    while time.monotonic() < until:
        i += 1
        text = f"repeated {i % 50}" if i % 5 == 0 else f"single {who}-{i}"  # every 5th: one of 50 texts
        async with http.post(f"{url}/v1/inference", json={"input": text, "timeout_ms": 10_000}) as resp:
            body = await resp.json()
        if resp.status != 200 or body.get("output") != expected_output(text):
            wrong.append(f"{text}: {resp.status} {body}")
        answered += 1
    return answered


async def call_client(http: aiohttp.ClientSession, url: str, who: int, until: float, wrong: list[str]) -> int:
    answered = 0
    rng = random.Random(who)
    i = 0
    while time.monotonic() < until:
        i += 1
        rows = [f"row {who}-{i}-{j}" for j in range(rng.randint(1, 3))]
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(rows)], "data": rows}],
                "parameters": {"timeout": 10_000_000}}  # (microseconds)
        async with http.post(f"{url}/v2/models/sim/infer", json=body, headers={"Authorization": f"Bearer {KEY}"}) as resp:
            answer = await resp.json()
        if resp.status != 200 or answer["outputs"][0]["data"] != [expected_output(r) for r in rows]:
            wrong.append(f"{rows}: {resp.status} {answer}")
        answered += 1
    return answered


async def test_single_requests_beside_short_calls_of_another_tier_are_all_answered(tmp_path):
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(write_config(tmp_path / "mixed.toml", CONFIG))])
    try:
        url = await asyncio.to_thread(server.wait_listening)
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.05)
            wrong: list[str] = []
            until = time.monotonic() + LOAD_S
            counts = await asyncio.gather(*(single_client(http, url, i, until, wrong) for i in range(8)),
                                          *(call_client(http, url, i, until, wrong) for i in range(3)))
            async with http.get(f"{url}/v1/models/sim") as resp:
                model = await resp.json()
            async with http.get(f"{url}/readyz") as resp:
                ready = resp.status
        assert not wrong, f"{len(wrong)} of {sum(counts)} answers wrong, the first: {wrong[:3]}"
        assert all(n >= 10 for n in counts), counts  # (every client kept being answered: ~30 ms batches)
        assert (model["worker_deaths"], model["workers_replaced"], model["stats"]["queue_depth"], ready) == (0, 0, 0, 200)
    finally:
        assert server.stop() == 0
