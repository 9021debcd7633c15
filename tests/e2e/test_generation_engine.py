"""The generation routes on a second engine, `inferd.backends.echo_engine` (no vLLM): a generation engine
is one module and a config line, and the routes' own behaviour (whole and streamed answers, `n`, stops,
deadlines, client aborts, the waiting bound, tier priorities, adapters) is tested in seconds. The echo
engine's output is a function of its prompt, so each answer is checked word for word.

vLLM's own behaviour (its sampling, logprobs, structured outputs, tool parsers) stays in
test_backend_vllm.py."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import orjson
import pytest
import pytest_asyncio

from inferd.config import AdapterConfig, AuthConfig, ModelConfig, TenantConfig, TierConfig

from ..helpers import running_server, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = {"enterprise": "echo-enterprise-key", "free": "echo-free-key"}


def bearer(tier: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tier]}"}


@pytest.fixture(scope="module")
def adapter_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("shouting")
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return str(folder)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(adapter_folder):
    model = ModelConfig(name="echo", kind="generation", backend="inferd.backends.echo_engine", max_waiting_requests=2,
                        timeout_ms=20000, options={"step_ms": 2, "max_running": 2, "max_tokens": 6},
                        adapters=(AdapterConfig("shouting", adapter_folder),))
    config = dict(
        auth=AuthConfig(enabled=True, anonymous_tier="free"),
        tiers=(TierConfig("enterprise", priority=2), TierConfig("free", priority=0)),
        tenants=tuple(TenantConfig(f"{t}-co", t, hashlib.sha256(k.encode()).hexdigest()) for t, k in KEYS.items()),
    )
    async with running_server(model, ready_timeout_s=30, **config) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def post(client, url, path, body, headers=None) -> tuple[int, dict]:
    async with client.post(f"{url}{path}", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def events(client, url, path, body) -> list[dict]:
    found = []
    async with client.post(f"{url}{path}", json={**body, "stream": True}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                found.append(orjson.loads(line[6:]))
    return found


async def test_the_engine_is_the_one_the_config_names(server, client):
    async with client.get(f"{server.url}/v1/models") as resp:
        listed = {m["id"]: m for m in (await resp.json())["data"]}
    assert listed["echo"]["kind"] == "generation" and listed["echo"]["max_model_len"] == 2048
    assert type(server.models.generation["echo"].engine).__name__ == "EchoEngine"


async def test_a_completion_whole_and_streamed(server, client):
    body = {"model": "echo", "prompt": "one two three", "max_tokens": 5}
    status, whole = await post(client, server.url, "/v1/completions", body)
    assert status == 200
    assert whole["choices"][0]["text"] == "one two three one two"
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}
    streamed = await events(client, server.url, "/v1/completions", body)
    assert "".join(e["choices"][0]["text"] for e in streamed if e["choices"]) == "one two three one two"


async def test_inferds_own_shape_and_a_chat(server, client):
    status, own = await post(client, server.url, "/v1/inference", {"model": "echo", "input": "a b", "max_tokens": 3})
    assert (status, own["output"], own["finish_reason"]) == (200, "a b a", "length")
    status, chat = await post(client, server.url, "/v1/chat/completions",
                              {"model": "echo", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2})
    assert status == 200 and chat["choices"][0]["message"] == {"role": "assistant", "content": "hi there"}


async def test_n_choices_and_a_stop_string(server, client):
    status, answer = await post(client, server.url, "/v1/completions",
                                {"model": "echo", "prompt": "x y z", "max_tokens": 3, "n": 3})
    assert status == 200
    assert sorted((c["index"], c["text"]) for c in answer["choices"]) == [(0, "x y z"), (1, "y z x"), (2, "z x y")]
    status, stopped = await post(client, server.url, "/v1/completions",
                                 {"model": "echo", "prompt": "go on stop now", "max_tokens": 8, "stop": ["stop"]})
    assert status == 200 and stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == "go on "


async def test_an_adapter_named_as_the_model_answers_through_it(server, client):
    status, answer = await post(client, server.url, "/v1/completions", {"model": "shouting", "prompt": "quiet please",
                                                                       "max_tokens": 2})
    assert status == 200 and answer["choices"][0]["text"] == "QUIET PLEASE"
    status, base = await post(client, server.url, "/v1/completions", {"model": "echo", "prompt": "quiet please",
                                                                     "max_tokens": 2})
    assert status == 200 and base["choices"][0]["text"] == "quiet please"


async def test_what_the_engine_refuses_is_a_400(server, client):
    status, body = await post(client, server.url, "/v1/completions",
                              {"model": "echo", "prompt": "p", "response_format": {"type": "json_object"}})
    assert status == 400 and "schema" in body["error"]["message"]
    status, body = await post(client, server.url, "/v1/chat/completions",
                              {"model": "echo", "messages": [{"role": "user", "content": "p"}],
                               "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert status == 400 and "tool" in body["error"]["message"]
    status, body = await post(client, server.url, "/v1/completions", {"model": "echo", "prompt": "w " * 1100})
    assert status == 400 and "2048" in body["error"]["message"]
    # (the prompt fits, the prompt and the tokens asked for do not: vLLM's server refuses it too, rather than cut it)
    status, body = await post(client, server.url, "/v1/chat/completions",
                              {"model": "echo", "messages": [{"role": "user", "content": "p"}], "max_tokens": 3000})
    assert status == 400 and "maximum context length is 2048" in body["error"]["message"]
    assert "`max_tokens` at most 20" in body["error"]["message"]  # (2048 less the prompt's tokens: 20xx)


async def test_a_deadline_and_a_client_leaving_abort_in_the_engine(server, client):
    model = server.models.generation["echo"]
    status, body = await post(client, server.url, "/v1/inference",
                              {"model": "echo", "input": "slow", "max_tokens": 2000, "timeout_ms": 80})
    assert (status, body["error"]) == (504, "DEADLINE_EXCEEDED")
    await until(lambda: model.engine.unfinished_requests() == 0, timeout_s=3)
    before = model.metrics.aborts.get("client_disconnect", 0)
    async with client.post(f"{server.url}/v1/inference",
                           json={"model": "echo", "input": "go on", "max_tokens": 2000, "stream": True}) as resp:
        assert (await resp.content.readline()).startswith(b"data: ")
        resp.close()
    await until(lambda: model.engine.unfinished_requests() == 0, timeout_s=3)
    assert model.metrics.aborts.get("client_disconnect", 0) == before + 1
    assert model.running == 0 and model.waiting == 0


async def test_the_waiting_bound_gives_503_and_enterprise_runs_ahead_of_free(server, client):
    model = server.models.generation["echo"]
    runners = []
    for i in range(2):  # max_running = 2: these hold both places in the engine
        runners.append(asyncio.create_task(post(client, server.url, "/v1/inference",
                                                {"model": "echo", "input": f"fill{i}", "max_tokens": 150}, bearer("free"))))
        await until(lambda: model.running == i + 1)  # noqa: B023 - awaited at once, in this iteration
    finished: list[str] = []

    async def tracked(name, tier):
        status, _ = await post(client, server.url, "/v1/inference", {"model": "echo", "input": name, "max_tokens": 2},
                               bearer(tier))
        finished.append(name)
        return status

    free_waiting = asyncio.create_task(tracked("free-queued", "free"))
    await until(lambda: model.waiting == 1)
    enterprise = asyncio.create_task(tracked("enterprise", "enterprise"))
    await until(lambda: model.waiting == 2)
    status, body = await post(client, server.url, "/v1/inference", {"model": "echo", "input": "one too many"})
    assert (status, body["error"]) == (503, "SERVICE_OVERLOADED") and body["retry_after_ms"] >= 1
    assert await enterprise == 200 and await free_waiting == 200
    assert finished.index("enterprise") < finished.index("free-queued"), finished
    assert [status for status, _ in await asyncio.gather(*runners)] == [200, 200]
