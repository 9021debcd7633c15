"""Identical work computed once: in-flight collapsing and the result cache, checked against what the
simulated GPU itself computed."""

from __future__ import annotations

import asyncio
import hashlib
import re

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig, TenantConfig

from ..helpers import backend_of, infer, running_server, sim_model, until

KEYS = {"acme": "key-acme", "bolt": "key-bolt"}
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier="default"),
            tenants=tuple(TenantConfig(t, "default", hashlib.sha256(k.encode()).hexdigest()) for t, k in KEYS.items()))


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


async def occupy(http, srv, text: str = "occupying the worker"):  # type: ignore[no-untyped-def]
    """A request that holds the only worker for one batch time, so what comes next waits in the queue."""
    task = asyncio.ensure_future(infer(http, srv.url, {"input": text}))
    await until(lambda: any(w.running_requests for w in srv.models["m"].snapshot(0).workers))
    return task


async def test_a_hundred_identical_requests_are_one_input_computed_and_a_hundred_right_answers(http):
    async with running_server(sim_model(latency_ms=100, max_batch_size=32, max_wait_ms=20)) as srv:
        model, gpu = srv.models["m"], backend_of(srv)
        busy = await occupy(http, srv)
        texts = ["same input"] * 100 + [f"other {i}" for i in range(20)] + ["same input"] * 20
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in texts))
        assert (await busy)[0] == 200
        for text, (status, body, _) in zip(texts, results, strict=True):
            assert status == 200 and body["output"] == expected_output(text), body
        assert gpu.computed["same input"] == 1 and all(gpu.computed[f"other {i}"] == 1 for i in range(20))
        assert gpu.calls_with_repeats == 0
        assert model.shared.collapsed == 119 and len(model.shared) == 0  # nothing left in flight
        collapsed = [h for _, _, h in results if "collapsed" in h.get("Server-Timing", "")]
        assert len(collapsed) == 119
        async with http.get(f"{srv.url}/metrics") as resp:
            assert 'inferd_collapsed_requests_total{model="m",version="1"} 119.0' in await resp.text()


async def test_a_rider_leaving_changes_nothing_for_the_rest_and_the_last_one_leaving_withdraws_it(http):
    async with running_server(sim_model(latency_ms=1000, max_batch_size=8, max_wait_ms=1)) as srv:
        model, gpu = srv.models["m"], backend_of(srv)
        busy = await occupy(http, srv)
        lead = asyncio.ensure_future(infer(http, srv.url, {"input": "dup"}))
        await until(lambda: len(model.shared) == 2)  # (the occupying input is in flight too)
        short = asyncio.ensure_future(infer(http, srv.url, {"input": "dup", "timeout_ms": 100}))
        gone = asyncio.ensure_future(infer(http, srv.url, {"input": "dup"}))
        late = asyncio.ensure_future(infer(http, srv.url, {"input": "dup", "timeout_ms": 5000}))
        await until(lambda: model.shared.collapsed == 3)
        gone.cancel()  # (the client closes its connection)
        status, body, _ = await short
        assert status == 504 and body["error"] == "DEADLINE_EXCEEDED"
        # every client of a second input leaves while it waits: it is never computed
        leavers = [asyncio.ensure_future(infer(http, srv.url, {"input": "left"})) for _ in range(3)]
        await until(lambda: len(model.shared) == 3 and model.shared.collapsed == 5)
        for task in leavers:
            task.cancel()
        await until(lambda: len(model.shared) == 2)
        for task in (lead, late):
            status, body, _ = await task
            assert status == 200 and body["output"] == expected_output("dup")
        await busy
        status, _, _ = await infer(http, srv.url, {"input": "after"})
        assert status == 200
        assert gpu.computed["dup"] == 1 and gpu.computed["left"] == 0


async def test_the_lead_leaving_leaves_its_computation_to_its_riders(http):
    async with running_server(sim_model(latency_ms=1000, max_batch_size=8, max_wait_ms=1)) as srv:
        model, gpu = srv.models["m"], backend_of(srv)
        busy = await occupy(http, srv)
        lead = asyncio.ensure_future(infer(http, srv.url, {"input": "dup"}))
        await until(lambda: len(model.shared) == 2)
        rider = asyncio.ensure_future(infer(http, srv.url, {"input": "dup"}))
        await until(lambda: model.shared.collapsed == 1)
        lead.cancel()  # the first client goes away while the worker is still busy
        await until(lambda: srv.lifecycle.in_flight == 2)
        assert model.batcher.depth == 1  # still queued, for the rider
        status, body, _ = await rider
        assert status == 200 and body["output"] == expected_output("dup")
        await busy
        assert gpu.computed["dup"] == 1


async def test_a_poison_input_fails_every_copy_of_itself_and_nobody_else(http):
    model = sim_model(backend="inferd.backends.faulty:create", latency_ms=50, max_batch_size=16, max_wait_ms=30,
                      options={"fail_marker": "POISON", "max_batch_size": 16})
    async with running_server(model) as srv:
        texts = ["POISON pill"] * 4 + [f"fine {i}" for i in range(6)]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in texts))
        assert [status for status, _, _ in results] == [500] * 4 + [200] * 6
        for text, (_, body, _) in zip(texts[4:], results[4:], strict=True):
            assert body["output"] == expected_output(text)
        assert len(srv.dead_letters.entries()) == 1  # one computation failed, however many waited on it


async def test_the_cache_answers_repeats_per_tenant_and_no_cache_asks_afresh(http):
    model = sim_model(latency_ms=20, cache_bytes=1 << 20, cache_ttl_s=60)  # (its expiry: tests/unit/models/test_result_cache)
    async with running_server(model, **AUTH) as srv:
        gpu = backend_of(srv)
        status, first, _ = await infer(http, srv.url, {"input": "q"}, headers=bearer("acme"))
        status, again, headers = await infer(http, srv.url, {"input": "q"}, headers=bearer("acme"))
        assert status == 200 and again["output"] == first["output"] == expected_output("q")
        assert headers["Server-Timing"] == 'cache;desc="hit"' and gpu.computed["q"] == 1
        _, other, headers = await infer(http, srv.url, {"input": "q"}, headers=bearer("bolt"))  # another tenant
        assert other["output"] == expected_output("q") and "cache" not in headers["Server-Timing"]
        assert gpu.computed["q"] == 2
        _, _, headers = await infer(http, srv.url, {"input": "q"}, headers={**bearer("acme"), "Cache-Control": "no-cache"})
        assert "cache" not in headers["Server-Timing"] and gpu.computed["q"] == 3
        async with http.get(f"{srv.url}/v1/models") as resp:
            cache = (await resp.json())["data"][0]["cache"]
        assert cache["hits"] == 1 and cache["entries"] >= 1 and 0 < cache["bytes"] <= 1 << 20
        async with http.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
        assert re.search(r'inferd_cache_requests_total\{model="m",result="hit",version="1"\} 1\.0', text)


async def test_embeddings_share_work_item_by_item(http):
    model = sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=30, cache_bytes=1 << 20)
    async with running_server(model) as srv:
        body = {"model": "emb", "input": ["a", "b", "a"]}
        async with http.post(f"{srv.url}/v1/embeddings", json=body) as resp:
            first = await resp.json()
        async with http.post(f"{srv.url}/v1/embeddings", json=body) as resp:
            again = await resp.json()
            assert 'cache;desc="hit 3 of 3"' in resp.headers["Server-Timing"]  # marked, as /v1/inference marks it
        vectors = [item["embedding"] for item in first["data"]]
        assert vectors[0] == vectors[2] != vectors[1] and [i["embedding"] for i in again["data"]] == vectors
        computed = srv.models["emb"].workers[0].backend.gpu.computed
        assert computed["a"] == 1 and computed["b"] == 1
