"""`Idempotency-Key`: a retried request is answered once, per tenant, and a key reused for another
request is refused."""

from __future__ import annotations

import asyncio
import hashlib

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig, TenantConfig

from ..helpers import backend_of, infer, running_server, sim_model, until

KEYS = {"acme": "key-acme", "bolt": "key-bolt"}
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier="default"),
            tenants=tuple(TenantConfig(t, "default", hashlib.sha256(k.encode()).hexdigest()) for t, k in KEYS.items()))


def keyed(tenant: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "Idempotency-Key": key}


async def test_a_repeat_in_flight_joins_and_a_later_one_is_replayed_and_computed_once(http):
    async with running_server(sim_model(latency_ms=300, collapse=False), **AUTH) as srv:
        gpu = backend_of(srv)
        first = asyncio.ensure_future(infer(http, srv.url, {"input": "pay 5"}, headers=keyed("acme", "k1")))
        await until(lambda: srv.lifecycle.in_flight == 1)
        joined = await infer(http, srv.url, {"input": "pay 5"}, headers=keyed("acme", "k1"))
        status, body, headers = await first
        assert status == 200 and body["output"] == expected_output("pay 5") and "Idempotent-Replayed" not in headers
        assert (joined[0], joined[1], joined[2]["Idempotent-Replayed"]) == (200, body, "true")
        status, again, headers = await infer(http, srv.url, {"input": "pay 5"}, headers=keyed("acme", "k1"))
        assert (status, again, headers["Idempotent-Replayed"]) == (200, body, "true")
        assert gpu.computed["pay 5"] == 1  # (collapsing is off: the key alone kept it to one)
        status, refused, _ = await infer(http, srv.url, {"input": "pay 6"}, headers=keyed("acme", "k1"))
        assert status == 422 and refused["error"] == "IDEMPOTENCY_KEY_REUSED"
        status, other, _ = await infer(http, srv.url, {"input": "pay 6"}, headers=keyed("bolt", "k1"))
        assert status == 200 and other["output"] == expected_output("pay 6")  # keys are per tenant
        assert srv.api.idempotency.replays == 2
        async with http.get(f"{srv.url}/v1/stats") as resp:
            table = (await resp.json())["idempotency"]
        assert table["keys"] == 2 and table["replays"] == 2 and 0 < table["bytes"] < 2 * 4096  # (acme's k1 and bolt's)


async def test_only_definite_answers_are_kept(http):
    async with running_server(sim_model(latency_ms=300), **AUTH) as srv:
        status, bad, _ = await infer(http, srv.url, {"input": 5}, headers=keyed("acme", "bad"))
        status2, bad2, headers = await infer(http, srv.url, {"input": 5}, headers=keyed("acme", "bad"))
        assert (status, status2, bad2, headers["Idempotent-Replayed"]) == (400, 400, bad, "true")  # a definite refusal
        leaving = asyncio.ensure_future(infer(http, srv.url, {"input": "gone"}, headers=keyed("acme", "k2")))
        await until(lambda: srv.lifecycle.in_flight == 1)
        leaving.cancel()  # no answer given: a retry runs
        await until(lambda: srv.lifecycle.in_flight == 0)
        status, body, headers = await infer(http, srv.url, {"input": "gone"}, headers=keyed("acme", "k2"))
        assert status == 200 and body["output"] == expected_output("gone") and "Idempotent-Replayed" not in headers


async def test_a_key_over_255_characters_is_refused(http):
    async with running_server(sim_model()) as srv:
        status, body, _ = await infer(http, srv.url, {"input": "x"}, headers={"Idempotency-Key": "k" * 256})
        assert status == 400 and "Idempotency-Key" in body["message"]
        status, _, _ = await infer(http, srv.url, {"input": "x"}, headers={"Idempotency-Key": "k" * 255})
        assert status == 200
