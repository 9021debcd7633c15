"""The scheduler end to end, above capacity: length buckets served side by side, tier priority that holds
across buckets, a light tenant not shed for a heavy one, token budgets. Short open-loop runs (a few
seconds) on a simulated GPU with two length buckets.

The load generator shares the server's event loop, so what a test offers costs this process CPU: the
tests of who goes first run a slower GPU (40 ms a batch of 4: ~100 req/s) at ~165 req/s offered, so that
on a host whose two cores are busy with other work the GPU stays the bottleneck they are about (at 660
req/s against ~400 beside a CPU hog per core, the loop itself was: every class waited alike)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from inferd.bench.loadgen import open_loop
from inferd.config import AuthConfig, TenantConfig, TierConfig

from ..helpers import backend_of, running_server, sim_model

SHORT, LONG = "short {i}", "a long input, well over fifty characters, in the second bucket {i}"


def bucketed(**kw):  # type: ignore[no-untyped-def]
    """20 ms per batch of up to 8, inputs over 50 characters in bucket 1: ~400 req/s of capacity."""
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("max_wait_ms", 2)
    kw.setdefault("latency_ms", 20)
    return sim_model(options={"bucket_chars": [50], "max_batch_size": 64}, **kw)


def slow_bucketed(**kw):  # type: ignore[no-untyped-def]
    """40 ms per batch of up to 4: ~100 req/s (see the module docstring)."""
    return bucketed(latency_ms=40, max_batch_size=4, **kw)


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def share(self, status: int) -> float:
        return self.statuses[status] / max(1, sum(self.statuses.values()))


async def offered(url: str, classes: dict[str, tuple[float, str, dict[str, str]]], seconds: float) -> dict[str, Outcome]:
    """Open-loop Poisson load, one stream per class: name -> (req/s, input template, headers)."""
    outcomes = {name: Outcome() for name in classes}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def stream(name: str, rate: float, template: str, headers: dict[str, str]) -> None:
            async def send(i: int, scheduled: float) -> None:
                body = {"input": template.format(i=i), "timeout_ms": 2000}
                async with session.post(f"{url}/v1/inference", json=body, headers=headers) as resp:
                    payload = await resp.json()
                outcome = outcomes[name]
                outcome.statuses[resp.status] += 1
                if resp.status == 200:
                    outcome.latencies.append(loop.time() - scheduled)
                else:
                    outcome.errors[payload["message"][:60]] += 1

            await open_loop(rate, seconds, random.Random(name), send)

        await asyncio.gather(*(stream(name, *spec) for name, spec in classes.items()))
    return outcomes


async def test_at_120_percent_both_buckets_are_served_with_waits_of_the_same_order():
    async with running_server(bucketed(max_queue=400)) as srv:
        result = await offered(srv.url, {"short": (432.0, SHORT, {}), "long": (48.0, LONG, {})}, 3.0)
        flushes = srv.models["m"].batcher.flushes
    short, long = result["short"], result["long"]
    assert short.statuses[504] == long.statuses[504] == 0  # 2 s deadlines are 100 batch times: never missed
    assert long.statuses[200] > 0.8 * 48 * 3  # the minority bucket is not starved
    assert long.p(0.99) <= 3 * short.p(0.99) + 0.1 and short.p(0.99) <= 3 * long.p(0.99) + 0.1, (short.p(0.99), long.p(0.99))
    assert flushes["full"] > 0


async def test_a_higher_tiers_long_inputs_go_before_a_lower_tiers_full_bucket():
    key = "enterprise-key"
    config = dict(auth=AuthConfig(enabled=True, anonymous_tier="free"),
                  tiers=(TierConfig("enterprise", priority=2), TierConfig("free")),
                  tenants=(TenantConfig("acme", "enterprise", hashlib.sha256(key.encode()).hexdigest()),))
    async with running_server(slow_bucketed(max_queue=75), **config) as srv:
        result = await offered(srv.url, {"free-short": (150.0, SHORT, {}),
                                         "enterprise-long": (15.0, LONG, {"Authorization": f"Bearer {key}"})}, 4.0)
    free, enterprise = result["free-short"], result["enterprise-long"]
    assert enterprise.statuses[200] == sum(enterprise.statuses.values())  # every one served, none shed
    # (behind free's full batches without tiers across buckets: seconds, and 504s). Not the p99: the load
    # generator shares this process's loop, whose pauses (a full GC of the suite's heap) land in a few
    # of its ~60 samples; the p95 already tells a scheduler that serves enterprise first from one that does not.
    # 7.5 and 15 batch times, and well ahead of free's own (~0.9 s here, 0.13 for enterprise).
    assert enterprise.p(0.5) < 0.3 and enterprise.p(0.95) < 0.6, (enterprise.p(0.5), enterprise.p(0.95))
    assert enterprise.p(0.5) < free.p(0.5) / 2, (enterprise.p(0.5), free.p(0.5))
    assert free.share(503) > 0.2  # the free tier takes the overload


async def test_a_light_tenant_is_not_shed_for_a_heavy_one():
    keys = {"heavy": "heavy-key", "light": "light-key"}
    config = dict(auth=AuthConfig(enabled=True), tiers=(TierConfig("paid", priority=1, max_predicted_wait_ms=300),),
                  tenants=tuple(TenantConfig(n, "paid", hashlib.sha256(k.encode()).hexdigest()) for n, k in keys.items()))
    async with running_server(slow_bucketed(max_queue=50), **config) as srv:
        result = await offered(srv.url, {
            "heavy": (150.0, SHORT, {"Authorization": f"Bearer {keys['heavy']}"}),
            "light": (15.0, SHORT, {"Authorization": f"Bearer {keys['light']}"}),
        }, 4.0)
    heavy, light = result["heavy"], result["light"]
    assert heavy.share(503) > 0.2  # 165 req/s against ~100: somebody is shed...
    assert light.share(503) <= heavy.share(503) / 2, (light.errors, heavy.errors)  # ...the heavy tenant first
    assert light.p(0.5) < 0.2, light.p(0.5)  # (5 batch times)


async def test_a_token_budget_holds_fewer_long_inputs_per_batch():
    model = bucketed(max_batch_size=16, max_batch_tokens=60, max_wait_ms=50)
    async with running_server(model) as srv:
        async with aiohttp.ClientSession() as session:
            async def send(text: str) -> int:
                async with session.post(f"{srv.url}/v1/inference", json={"input": text}) as resp:
                    return resp.status

            statuses = await asyncio.gather(*(send(LONG.format(i=i)) for i in range(12)),
                                            *(send(SHORT.format(i=i)) for i in range(16)))
        sizes = [size for _, _, size in backend_of(srv).calls[1:]]
    assert set(statuses) == {200}
    # A long input counts ~18 tokens (a quarter of its characters): three fit in 60; a short one ~3.
    assert max(sizes) == 16 and 3 in sizes and all(size <= 16 for size in sizes), sizes
