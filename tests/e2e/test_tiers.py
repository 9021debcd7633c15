"""Tiers and tenants: keys, rate limits that follow capacity, priority, fairness, tiered shedding."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time

import pytest

from inferd.config import AuthConfig, TenantConfig, TierConfig

from .. import fakes
from ..helpers import infer, running_server, sim_model, until


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS = {"acme": "key-acme-enterprise", "bolt": "key-bolt-paid", "cats": "key-cats-free", "dogs": "key-dogs-free"}
TENANTS = (
    TenantConfig("acme", "enterprise", digest(KEYS["acme"])),
    TenantConfig("bolt", "paid", digest(KEYS["bolt"])),
    TenantConfig("cats", "free", digest(KEYS["cats"])),
    TenantConfig("dogs", "free", digest(KEYS["dogs"])),
)


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def tiers(free_rate=None, free_wait_ms=None, paid_wait_ms=None, promote_ms=None):
    return (
        TierConfig("enterprise", priority=2),
        TierConfig("paid", priority=1, max_predicted_wait_ms=paid_wait_ms),
        TierConfig("free", priority=0, rate_per_s=free_rate, burst=free_rate, max_predicted_wait_ms=free_wait_ms,
                   promote_after_ms=promote_ms),
    )


def server(model=None, anonymous="free", **tier_kw):
    return dict(auth=AuthConfig(enabled=True, anonymous_tier=anonymous), tiers=tiers(**tier_kw), tenants=TENANTS), model


async def test_keys_identify_tenants_and_bad_keys_get_401_without_leaking(http, caplog):
    kw, _ = server(anonymous=None)
    with caplog.at_level(logging.DEBUG):
        async with running_server(sim_model(), access_log_sample_rate=1.0, **kw) as srv:
            status, body, _ = await infer(http, srv.url, {"input": "x"}, headers={"Authorization": "Bearer not-a-key"})
            assert (status, body["error"]) == (401, "UNAUTHORIZED")
            assert "not-a-key" not in str(body)
            status, body, _ = await infer(http, srv.url, {"input": "x"})
            assert (status, body["error"]) == (401, "UNAUTHORIZED")  # anonymous refused: no anonymous_tier
            status, body, _ = await infer(http, srv.url, {"input": "x"}, headers={"X-API-Key": KEYS["acme"]})
            assert status == 200
            async with http.get(f"{srv.url}/v1/limits", headers=bearer("bolt")) as resp:
                limits = await resp.json()
            assert (limits["tenant"], limits["tier"]) == ("bolt", "paid")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"tier":"enterprise"' in logged  # the access log names the tier...
    for key in (*KEYS.values(), "not-a-key"):
        assert key not in logged  # ...and never a key


async def test_a_tenant_over_its_rate_gets_429_and_its_neighbour_does_not(http):
    kw, _ = server(free_rate=5)
    async with running_server(sim_model(latency_ms=5, max_wait_ms=1), **kw) as srv:
        cats = [await infer(http, srv.url, {"input": f"c{i}"}, headers=bearer("cats")) for i in range(8)]
        statuses = [s for s, _, _ in cats]
        assert statuses[:5] == [200] * 5 and 429 in statuses[5:]
        status, body, headers = next(r for r in cats if r[0] == 429)
        assert body["error"] == "RATE_LIMITED"
        assert 1 <= body["retry_after_ms"] <= 1000 and int(headers["Retry-After"]) >= 1
        dogs = [await infer(http, srv.url, {"input": f"d{i}"}, headers=bearer("dogs")) for i in range(5)]
        assert [s for s, _, _ in dogs] == [200] * 5
        await asyncio.sleep(body["retry_after_ms"] / 1000 + 0.05)
        assert (await infer(http, srv.url, {"input": "again"}, headers=bearer("cats")))[0] == 200


async def open_loop(http, url, rate, duration_s, pick, seed=3):
    """Poisson arrivals; `pick(rng)` -> (tenant, body). Returns [(tenant, status, latency_s)]."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    results, tasks = [], []

    async def one(tenant, body, scheduled):
        status, _, _ = await infer(http, url, body, headers=bearer(tenant))
        results.append((tenant, status, loop.time() - scheduled))

    t = start = loop.time()
    while True:
        t += rng.expovariate(rate)
        if t - start > duration_s:
            break
        await asyncio.sleep(max(0.0, t - loop.time()))
        tenant, body = pick(rng)
        tasks.append(asyncio.create_task(one(tenant, body, t)))
    await asyncio.gather(*tasks)
    return results


@pytest.mark.slow
async def test_under_2x_overload_enterprise_is_served_and_free_is_shed_first(http):
    # capacity: 10 per 50 ms batch = 200 req/s; offered 400 req/s: 70% free, 25% paid, 5% enterprise
    model = sim_model(latency_ms=50, max_batch_size=10, max_wait_ms=5, max_queue=2000)
    kw, _ = server(free_wait_ms=100, paid_wait_ms=400)
    async with running_server(model, **kw) as srv:
        def pick(rng):
            r = rng.random()
            tenant = "cats" if r < 0.70 else "bolt" if r < 0.95 else "acme"
            return tenant, {"input": f"{tenant}-{rng.random()}"}

        results = await open_loop(http, srv.url, rate=400, duration_s=4, pick=pick)
    by_tier = {t: [(s, lat) for tenant, s, lat in results if tenant == t] for t in ("acme", "bolt", "cats")}
    assert sum(len(v) for v in by_tier.values()) == len(results) > 1400  # every request got an answer
    assert all(s in (200, 503) for _, s, _ in results)
    enterprise = by_tier["acme"]
    assert [s for s, _ in enterprise] == [200] * len(enterprise)
    p95 = sorted(lat for _, lat in enterprise)[int(len(enterprise) * 0.95) - 1]
    # A few batch times, whatever the overload; without priority (FIFO behind ~2,000 queued) it would be
    # seconds. The p95 of ~80 samples, not the p99 (its largest): client and server share this event
    # loop, and one of its pauses on a loaded CI machine must not decide the test.
    assert p95 < 1.0, p95

    def shed(t):
        return sum(1 for s, _ in by_tier[t] if s == 503) / len(by_tier[t])

    assert shed("cats") > 0.4 and shed("cats") > shed("bolt") + 0.2, (shed("cats"), shed("bolt"))


@pytest.mark.slow
async def test_a_tenant_ten_times_bigger_cannot_take_the_small_ones_slots(http):
    model = sim_model(latency_ms=50, max_batch_size=10, max_wait_ms=2, max_queue=5000)
    kw, _ = server()

    async def small_tenant(srv, n=30):
        latencies = []
        for i in range(n // 3):
            started = time.monotonic()
            results = await asyncio.gather(*(infer(http, srv.url, {"input": f"s{i}.{j}"}, headers=bearer("dogs")) for j in range(3)))
            assert all(s == 200 for s, _, _ in results)
            latencies.append(time.monotonic() - started)
        return sorted(latencies)[len(latencies) // 2]

    async with running_server(model, **kw) as srv:
        alone = await small_tenant(srv)
        flood = [asyncio.create_task(infer(http, srv.url, {"input": f"big{i}"}, headers=bearer("cats"))) for i in range(600)]
        await until(lambda: srv.models["m"].batcher.depth >= 500)  # the big tenant's backlog (3 s of work) is queued first
        shared = await small_tenant(srv)
        await asyncio.gather(*flood)
    # Behind a FIFO the small tenant would wait ~3 s for the backlog; taking turns it waits a batch or two.
    assert shared < alone + 0.5, (alone, shared)


async def test_losing_a_worker_lowers_budgets_and_its_return_restores_them(http):
    fakes.reset()
    model = sim_model(backend="tests.fakes:switchable", workers=2, max_batch_size=4, max_wait_ms=1,
                      batch_timeout_ms=200, options={"latency_ms": 20, "hang_s": 3600, "startup_delay_ms": 1200})
    kw, _ = server(free_rate=100)
    async with running_server(model, **kw) as srv:
        async def rate_now():
            async with http.get(f"{srv.url}/v1/limits", headers=bearer("cats")) as resp:
                return (await resp.json())["models"]["m"]["rate_per_s"]

        await asyncio.gather(*(infer(http, srv.url, {"input": f"w{i}"}, headers=bearer("dogs")) for i in range(8)))
        assert await rate_now() == pytest.approx(100, rel=0.15)
        await infer(http, srv.url, {"input": "HANG"}, headers=bearer("dogs"))  # one worker is given up on
        assert srv.models["m"].pool.healthy == 1
        assert await rate_now() == pytest.approx(50, rel=0.15)
        await until(lambda: srv.models["m"].pool.healthy == 2)  # the replacement takes 1.2 s to build
        assert await rate_now() == pytest.approx(100, rel=0.15)
    fakes.reset()


async def test_the_starvation_guard_promotes_old_free_requests(http):
    model = sim_model(latency_ms=30, max_batch_size=2, max_wait_ms=0, max_queue=5000)
    kw, _ = server(promote_ms=300)
    async with running_server(model, **kw) as srv:
        paid = [asyncio.create_task(infer(http, srv.url, {"input": f"p{i}"}, headers=bearer("bolt"))) for i in range(120)]
        await until(lambda: srv.models["m"].batcher.depth >= 100)
        started = time.monotonic()
        status, _, _ = await infer(http, srv.url, {"input": "patient"}, headers=bearer("cats"))
        waited = time.monotonic() - started
        await asyncio.gather(*paid)
    assert status == 200
    # 120 paid requests are 1.8 s of work ahead of it; promoted after 300 ms it runs within a batch or two.
    assert waited < 0.3 + 0.7, waited


async def test_a_full_queue_sheds_a_free_request_for_an_enterprise_one_and_counts_shed_and_refused_apart(http):
    kw, _ = server()
    async with running_server(sim_model(latency_ms=300, max_batch_size=1, max_wait_ms=0, max_queue=3), **kw) as srv:
        model = srv.models["m"]
        busy = asyncio.create_task(infer(http, srv.url, {"input": "busy"}, headers=bearer("cats")))
        await until(lambda: model.workers[0].current is not None)
        queued = []
        for i, tenant in enumerate(("dogs", "cats", "dogs")):
            queued.append(asyncio.create_task(infer(http, srv.url, {"input": f"q{i}"}, headers=bearer(tenant))))
            await until(lambda n=i + 1: model.batcher.depth == n)
        enterprise = asyncio.create_task(infer(http, srv.url, {"input": "e"}, headers=bearer("acme")))
        shed_status, shed_body, _ = await queued[2]  # the newest request of the heaviest free tenant
        late_status, late_body, _ = await infer(http, srv.url, {"input": "late"}, headers=bearer("cats"))
        results = await asyncio.gather(busy, enterprise, queued[0], queued[1])
        shed, refused = dict(model.metrics.shed), dict(model.metrics.refused)
    assert (shed_status, shed_body["error"]) == (503, "SERVICE_OVERLOADED") and shed_body["retry_after_ms"] > 0
    assert "higher tier" in shed_body["message"]
    # Full again (q0, q1 and enterprise's): nobody below free, and cats holds no more than dogs: refused.
    assert (late_status, late_body["error"]) == (503, "SERVICE_OVERLOADED")
    assert [status for status, _, _ in results] == [200] * 4
    # The evicted one counted as shed (for a higher tier), the late one as refused, once each: the late one
    # may be refused before the queue's bound is even reached (an enterprise request a second at 300 ms a
    # request: its wait passes its deadline)
    assert shed == {("m", "free", "for_higher_tier"): 1}, shed
    assert sum(refused.values()) == 1 and set(refused) <= {("m", "free", "queue_full"), ("m", "free", "deadline_infeasible")}
