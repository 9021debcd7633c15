"""What a load balancer sees: the HAProxy agent-check answer, lame duck, request identity."""

from __future__ import annotations

import asyncio

from ..helpers import infer, running_server, sim_model, until
from .test_metrics import free_port


async def agent_says(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    line = await reader.readline()
    writer.close()
    return line.decode()


async def test_agent_weight_follows_the_predicted_wait_and_drains_on_sigterm(http):
    port = free_port()
    model = sim_model(latency_ms=100, max_batch_size=2, max_wait_ms=0, max_queue=100, timeout_ms=30000, max_timeout_ms=30000)
    async with running_server(model, agent_port=port, agent_full_wait_ms=1000) as srv:
        assert await agent_says(port) == "ready 100%\n"
        backlog = [asyncio.create_task(infer(http, srv.url, {"input": f"q{i}"})) for i in range(16)]
        await until(lambda: srv.models["m"].batcher.depth >= 12)  # the backlog is queued
        busy = await agent_says(port)
        weight = int(busy.removeprefix("ready ").removesuffix("%\n"))
        assert busy.startswith("ready ") and weight < 80  # ~0.7 s of predicted wait
        drain = asyncio.create_task(srv.drain_and_stop())
        await until(lambda: not srv.lifecycle.serving)
        assert await agent_says(port) == "drain\n"
        assert all(s == 200 for s, _, _ in await asyncio.gather(*backlog))
        assert await drain


async def test_lame_duck_keeps_serving_while_not_ready(http):
    async with running_server(sim_model(latency_ms=600, max_wait_ms=0), lame_duck_s=0.4) as srv:
        url = srv.url
        drain = asyncio.create_task(srv.drain_and_stop())
        await until(lambda: srv.lifecycle.phase.value == "lame_duck")
        async with http.get(f"{url}/readyz") as resp:
            assert resp.status == 503 and (await resp.json())["phase"] == "lame_duck"
        served = asyncio.create_task(infer(http, url, {"input": "still served"}))  # in flight past the lame duck
        await until(lambda: srv.models["m"].workers[0].current is not None)  # admitted in the lame duck, computing
        await until(lambda: srv.lifecycle.draining)
        status, body, _ = await infer(http, url, {"input": "now refused"})
        assert (status, body["error"]) == (503, "DRAINING")
        assert (await served)[0] == 200
        assert await drain


async def test_idempotency_key_is_an_alias_for_the_request_id(http):
    async with running_server() as srv:
        _, body, headers = await infer(http, srv.url, {"input": "x"}, headers={"Idempotency-Key": "order-77"})
        assert body["request_id"] == headers["X-Request-ID"] == "order-77"


async def test_agent_and_readyz_agree_when_a_generation_model_failed_to_start(http):
    from inferd.config import ModelConfig

    port = free_port()
    broken = ModelConfig(name="gen", kind="generation", backend="inferd.backends.vllm")  # no model_path
    async with running_server(sim_model(latency_ms=5), broken, wait_ready=False, agent_port=port) as srv:
        await until(lambda: srv.models["m"].ready)
        assert srv.models["gen"].start_error is not None
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503
        assert await agent_says(port) == "drain\n"
