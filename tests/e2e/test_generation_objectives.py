"""Generation admitted by its objectives, against the real server: the simulated engine
(`inferd.backends.sim_engine`) with a time-to-first-token and a time-per-output-token objective. A
burst past what the engine can start in time is refused at once with the predicted figures; what is
admitted is answered; nothing is lost; the figures are in /v1/models and /metrics (vLLM's names too)."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest
import pytest_asyncio

from inferd.config import AuthConfig, ModelConfig, TenantConfig, TierConfig

from ..helpers import running_server, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENTERPRISE_KEY = "objectives-enterprise-key"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    model = ModelConfig(name="llm", kind="generation", backend="inferd.backends.sim_engine", ttft_slo_ms=300,
                        tpot_slo_ms=60, timeout_ms=20000, max_waiting_requests=500,
                        options={"step_ms": 5, "step_ms_per_sequence": 0.0, "max_running": 4, "max_tokens": 40})
    config = dict(
        auth=AuthConfig(enabled=True, anonymous_tier="free"),
        tiers=(TierConfig("enterprise", priority=2), TierConfig("free", priority=0)),
        tenants=(TenantConfig("big-co", "enterprise", hashlib.sha256(ENTERPRISE_KEY.encode()).hexdigest()),),
    )
    async with running_server(model, ready_timeout_s=30, **config) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def complete(client, url, i, headers=None, max_tokens=40, model="llm"):
    body = {"model": model, "prompt": f"word number {i}", "max_tokens": max_tokens}
    async with client.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers), asyncio.get_running_loop().time()


async def test_a_burst_is_refused_at_once_with_its_figures_and_the_admitted_are_answered(server, client):
    model = server.models.generation["llm"]
    before = dict(model.metrics.refusals)
    answers = await asyncio.gather(*(complete(client, server.url, i) for i in range(40)))
    ok = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    assert len(ok) + len(refused) == 40, [a[0] for a in answers]  # nothing else: no request lost, none withdrawn late
    assert 4 <= len(ok) < 40 and refused
    first_answer = min(a[3] for a in ok)
    assert all(a[3] < first_answer for a in refused)  # refused before any admitted request was done: at once
    for _status, body, headers, _ in refused:
        error = body["error"]
        assert error["code"] == "SERVICE_OVERLOADED" and "predicted time to first token" in error["message"]
        assert "300 ms objective" in error["message"]
        assert "predicted;dur=" in headers["Server-Timing"] and "budget;dur=" in headers["Server-Timing"]
    for _status, body, _, _ in ok:  # each its own prompt's words back, 40 of them
        words = body["choices"][0]["text"].split()
        assert len(words) == 40 and set(words) <= {"word", "number", *(str(i) for i in range(40))}
    assert model.metrics.refusals.get("ttft_objective", 0) - before.get("ttft_objective", 0) == len(refused)
    assert model.book.waiting == 0 and not model.book.running  # every promise ended


async def test_a_higher_tier_gets_in_where_the_lower_one_is_refused(server, client):
    fill = [asyncio.create_task(complete(client, server.url, i, max_tokens=40)) for i in range(30)]
    await asyncio.sleep(0.05)  # the free requests hold every place, for ~200 ms more at least
    status, body, _, _ = await complete(client, server.url, 99, {"Authorization": f"Bearer {ENTERPRISE_KEY}"}, max_tokens=4)
    free = await asyncio.gather(*fill)
    assert any(s == 503 for s, *_ in free)
    assert status == 200, body  # ahead of every free request still waiting, within its objective


async def test_the_objectives_and_predictions_are_reported(server, client):
    async with client.get(f"{server.url}/v1/models") as resp:
        described = next(m for m in (await resp.json())["data"] if m["id"] == "llm")
    assert (described["ttft_slo_ms"], described["tpot_slo_ms"]) == (300, 60)
    # (the burst before was refused for its objectives: which one, TTFT or, on a host busy enough to slow the
    # simulated steps, TPOT, the host decides)
    refusals = described["stats"]["refusals"]
    assert described["costs"]["step_ms_fixed"] > 0 and refusals.get("ttft_objective", 0) + refusals.get("tpot_objective", 0) > 0
    async with client.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    for line in ('vllm:num_requests_running{model_name="llm"}', 'vllm:kv_cache_usage_perc{model_name="llm"}',
                 'vllm:time_to_first_token_seconds_count{model_name="llm"}', 'inferd_generation_ttft_objective_seconds{model="llm"} 0.3',
                 'inferd_generation_refusals_total{model="llm",reason="t',  # (ttft_objective or tpot_objective)
                 'inferd_generation_predicted_ttft_seconds{model="llm"}'):
        assert line in text, line


async def test_metrics_export_every_name_the_generation_autoscaler_asks_for(server, client):
    import re
    from pathlib import Path

    import yaml

    folder = Path(__file__).parents[2] / "deploy" / "k8s-generation"
    patches = yaml.safe_load((folder / "kustomization.yaml").read_text())["patches"]
    (replace,) = yaml.safe_load(next(p for p in patches if p["target"]["kind"] == "ScaledObject")["patch"])
    asked = {name for t in replace["value"] for name in re.findall(r"inferd_[a-z_]+", t["metadata"]["query"])}
    async with client.get(f"{server.url}/metrics") as resp:
        exported = set(re.findall(r"^(inferd_[a-z_]+)", await resp.text(), re.M))
    assert len(asked) == 3 and asked <= exported, asked - exported


async def test_requests_past_what_the_kv_cache_holds_wait_for_it_and_the_engine_preempts_none(client):
    # room for 4 sequences of their prompt and 40 tokens each, places for 16: given them all at once, the engine
    # would start 16 (their prompts fit) and preempt as their outputs grew
    model = ModelConfig(name="small-kv", kind="generation", backend="inferd.backends.sim_engine", timeout_ms=20000,
                        options={"step_ms": 2, "max_running": 16, "kv_cache_tokens": 200, "max_tokens": 40})
    async with running_server(model, ready_timeout_s=30) as srv:
        generation = srv.models.generation["small-kv"]
        answers = asyncio.gather(*(complete(client, srv.url, i, model="small-kv") for i in range(12)))
        kept_back = 0
        while not answers.done():
            kept_back = max(kept_back, generation.book.kept_back)
            await asyncio.sleep(0.002)
        statuses = [a[0] for a in await answers]
        stats = generation.describe()["stats"]
    assert statuses == [200] * 12
    assert kept_back > 0 and stats["preemptions"] == 0 and stats["kept_back"] == 0


async def test_requests_kept_back_for_kv_end_at_once_when_their_model_stops(client):
    """A model stopping (an unload, a rollout, the server's shutdown) answers the requests it was keeping
    back for KV room, and those its engine was running, with a 503 at once, not at their deadlines (20 s
    here): nothing waits on a model that is gone."""
    model = ModelConfig(name="small-kv", kind="generation", backend="inferd.backends.sim_engine", timeout_ms=20000,
                        options={"step_ms": 20, "max_running": 16, "kv_cache_tokens": 200, "max_tokens": 40})
    async with running_server(model, ready_timeout_s=30) as srv:
        generation = srv.models.generation["small-kv"]
        answers = asyncio.gather(*(complete(client, srv.url, i, model="small-kv") for i in range(12)))
        await until(lambda: generation.book.kept_back >= 6)
        kept = generation.book.kept_back
        stopped_at = asyncio.get_running_loop().time()
        await generation.stop()
        ended = await asyncio.wait_for(answers, 10)
        late = await complete(client, srv.url, 99, model="small-kv")  # (after: refused as stopping, not "starting")
    assert [status for status, *_ in ended] == [503] * 12 and kept > 0
    assert all(body["error"]["code"] == "NOT_READY" for _, body, _, _ in ended)  # (OpenAI's error shape)
    assert late[0] == 503 and "is stopping" in late[1]["error"]["message"]
    assert max(at for *_, at in ended) - stopped_at < 2
