"""OpenAI's `POST /v1/embeddings`, spoken to by the official `openai` client: the real MiniLM for the
vectors, a fake embedder on a simulated GPU where a test needs controlled timing."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import numpy as np
import pytest

from inferd.config import AuthConfig, ModelConfig, TenantConfig, TierConfig

from ..helpers import running_server, until

openai = pytest.importorskip("openai")


def fake(**kw) -> ModelConfig:
    latency_ms = kw.pop("latency_ms", 20)
    return ModelConfig(name="emb", backend="tests.fakes:fake_embedder", options={"latency_ms": latency_ms},
                       max_batch_size=kw.pop("max_batch_size", 4), max_wait_ms=kw.pop("max_wait_ms", 5), **kw)


def client(url: str, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def chars(text: str) -> list[float]:
    return [float(ord(c)) for c in (text + "    ")[:4]]


async def post(http, url: str, body: dict) -> tuple[int, dict]:
    async with http.post(f"{url}/v1/embeddings", json=body) as resp:
        return resp.status, await resp.json()


async def test_the_openai_client_gets_the_models_own_vectors_in_order():
    pytest.importorskip("torch")
    from inferd.backends.transformer import TextModel

    direct = TextModel("cpu", {"max_tokens": 64, "bucket_edges": [8, 16, 32, 64]})
    words = "servers gather requests into batches and run each batch on one device".split()
    inputs = [" ".join(words[: 1 + i % len(words)]) for i in range(11)]  # mixed lengths: several buckets
    model = ModelConfig(name="minilm", backend="inferd.backends.transformer:create", max_batch_size=4, max_wait_ms=20,
                        options={"max_tokens": 64, "bucket_edges": [8, 16, 32, 64]})
    async with running_server(model) as srv:
        async with client(srv.url) as api:
            floats = await api.embeddings.create(model="minilm", input=inputs, encoding_format="float")
            decoded = await api.embeddings.create(model="minilm", input=inputs)  # the client asks for base64 and decodes it
            token_ids = direct.tokenize(inputs[3])[1:-1].tolist()  # without [CLS]/[SEP]: the server adds them
            from_ids = await api.embeddings.create(model="minilm", input=[token_ids, inputs[3]], encoding_format="float")
            listed = await api.models.list()
        assert srv.models["minilm"].stats.batches > 3  # the items ran in several batches
    assert [d.index for d in floats.data] == list(range(len(inputs)))
    for text, a, b in zip(inputs, floats.data, decoded.data):
        expected = direct([direct.tokenize(text)])[0]
        assert np.max(np.abs(np.array(a.embedding, dtype=np.float32) - expected)) < 1e-4
        assert np.max(np.abs(np.array(b.embedding, dtype=np.float32) - expected)) < 1e-4
    assert floats.usage.prompt_tokens == sum(len(direct.tokenize(t)) for t in inputs)
    assert floats.model == "minilm"
    assert np.max(np.abs(np.array(from_ids.data[0].embedding) - np.array(from_ids.data[1].embedding))) < 1e-5
    assert [m.id for m in listed.data] == ["minilm"] and listed.data[0].object == "model"


async def test_base64_is_little_endian_float32(http):
    async with running_server(fake()) as srv:
        status, body = await post(http, srv.url, {"model": "emb", "input": ["abcd", "wxyz"], "encoding_format": "base64"})
    assert status == 200
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() for d in body["data"]]
    assert vectors == [chars("abcd"), chars("wxyz")]


async def test_bad_calls_get_openai_shaped_400s_and_nothing_is_computed(http):
    async with running_server(fake(max_inputs_per_call=3)) as srv:
        async with client(srv.url) as api:
            for bad in ([], ["a", ""], ["a", 3], [[1, 2], [True]], ["a", "b", "c", "d"], [[]]):
                with pytest.raises(openai.BadRequestError) as caught:
                    await api.embeddings.create(model="emb", input=bad)
                error = caught.value.body
                assert caught.value.status_code == 400 and error["code"] == "INVALID_INPUT"
                assert error["type"] == "invalid_request_error" and error["message"]
            with pytest.raises(openai.NotFoundError) as caught:
                await api.embeddings.create(model="nope", input="x")
            assert caught.value.body["code"] == "MODEL_NOT_FOUND"
        status, body = await post(http, srv.url, {"model": "emb", "input": "x", "encoding_format": "hex"})
        assert status == 400 and body["error"]["code"] == "INVALID_INPUT"
        computed = srv.models["emb"].workers[0].backend.gpu.computed
    assert set(computed) == {"warmup"}


async def test_a_model_that_is_not_an_embedding_model_is_refused(http):
    sim = ModelConfig(name="m", backend="inferd.backends.sim:create", options={"latency_ms": 5})
    async with running_server(sim) as srv:
        status, body = await post(http, srv.url, {"model": "m", "input": "x"})
    assert status == 400 and "does not produce embeddings" in body["error"]["message"]


async def test_rate_limits_count_every_item():
    key = "key-of-tenant-t"
    limited = dict(auth=AuthConfig(enabled=True), tiers=(TierConfig("free", rate_per_s=0.01, burst=5),),
                   tenants=(TenantConfig("t", "free", hashlib.sha256(key.encode()).hexdigest()),))
    async with running_server(fake(), **limited) as srv:
        async with client(srv.url, key) as api:
            await api.embeddings.create(model="emb", input=["a", "b", "c"])  # 3 of the 5 tokens
            with pytest.raises(openai.RateLimitError) as caught:
                await api.embeddings.create(model="emb", input=["d", "e", "f"])  # 3 more: only 2 left
            assert caught.value.body["code"] == "RATE_LIMITED" and caught.value.body["retry_after_ms"] > 0
            assert caught.value.response.headers["Retry-After"]
            await api.embeddings.create(model="emb", input=["d", "e"])  # the 2 left
            with pytest.raises(openai.AuthenticationError):
                await client(srv.url, "wrong").embeddings.create(model="emb", input="x")


async def test_a_client_that_leaves_takes_its_queued_items_with_it(http):
    async with running_server(fake(latency_ms=300, max_batch_size=2)) as srv:
        served = srv.models["emb"]
        busy = asyncio.create_task(post(http, srv.url, {"model": "emb", "input": ["busy1", "busy2"]}))
        await until(lambda: served.workers[0].current is not None)  # the worker is inside the 300 ms call
        leaving = asyncio.create_task(post(http, srv.url, {"model": "emb", "input": ["gone1", "gone2", "gone3"]}))
        await until(lambda: served.batcher.depth == 3)  # all three are queued behind the running batch
        leaving.cancel()
        await until(lambda: served.batcher.depth == 0)  # the server noticed and withdrew them
        status, body = await busy
        assert status == 200 and [d["embedding"] for d in body["data"]] == [chars("busy1"), chars("busy2")]
        status, body = await post(http, srv.url, {"model": "emb", "input": ["after"]})
        assert status == 200
        computed = served.workers[0].backend.gpu.computed
    assert not {"gone1", "gone2", "gone3"} & set(computed)


async def test_a_small_call_takes_turns_with_the_big_calls_queued_before_it(http):
    """Fairness between one tenant's calls: each call gives one input per turn, so the small call's
    inputs run in the first batches rather than after every input of the big calls (FIFO: the last)."""
    async with running_server(fake(latency_ms=300, max_batch_size=4)) as srv:
        served = srv.models["emb"]
        busy = asyncio.create_task(post(http, srv.url, {"model": "emb", "input": "busy"}))
        await until(lambda: served.workers[0].current is not None)  # the worker is inside a 300 ms call
        calls, done = {}, []

        async def call(name: str, n: int) -> None:
            status, body = await post(http, srv.url, {"model": "emb", "input": [f"{name}{i}" for i in range(n)]})
            assert status == 200 and [d["embedding"] for d in body["data"]] == [chars(f"{name}{i}") for i in range(n)]
            done.append(name)

        for name, n, depth in (("a", 8, 8), ("b", 8, 16), ("s", 4, 20)):  # queued in this order
            calls[name] = asyncio.create_task(call(name, n))
            await until(lambda depth=depth: served.batcher.depth == depth)
        await asyncio.gather(busy, *calls.values())
        ran = list(served.workers[0].backend.gpu.computed)  # in computation order (its warm-up input first)
    computed = ran[ran.index("busy") + 1:]
    assert sorted(computed) == sorted([f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)] + [f"s{i}" for i in range(4)])
    assert max(computed.index(f"s{i}") for i in range(4)) < 12  # within the first 3 batches (FIFO: 16-19)
    assert done[0] == "s"


async def test_admission_predicts_a_small_calls_wait_by_the_turns_not_by_the_backlog(http):
    """Behind two 16-input calls (8 batches of 4), a 4-input call with a 2 s deadline finishes in its
    first 3 batches (~1.2 s with the one running): admitted and answered in time. Counted as a FIFO
    (every input of the big calls ahead: 9 batches, ~3 s), admission refused it with a 503."""
    async with running_server(fake(latency_ms=300, max_batch_size=4)) as srv:
        served = srv.models["emb"]
        busy = asyncio.create_task(post(http, srv.url, {"model": "emb", "input": "busy"}))
        await until(lambda: served.workers[0].current is not None)  # the worker is inside a 300 ms call
        big = []
        for name, depth in (("a", 16), ("b", 32)):
            big.append(asyncio.create_task(post(http, srv.url, {"model": "emb", "input": [f"{name}{i}" for i in range(16)]})))
            await until(lambda depth=depth: served.batcher.depth == depth)
        status, body = await post(http, srv.url, {"model": "emb", "input": [f"s{i}" for i in range(4)], "timeout_ms": 2000})
        assert status == 200, body
        assert [d["embedding"] for d in body["data"]] == [chars(f"s{i}") for i in range(4)]
        assert all(status == 200 for status, _ in await asyncio.gather(busy, *big))


async def test_a_call_past_its_deadline_gets_a_504_in_openai_shape(http):
    async with running_server(fake(latency_ms=300, max_batch_size=1)) as srv:
        served = srv.models["emb"]
        busy = asyncio.create_task(post(http, srv.url, {"model": "emb", "input": "busy"}))
        await until(lambda: served.workers[0].current is not None)
        status, body = await post(http, srv.url, {"model": "emb", "input": ["late"], "timeout_ms": 350})
        await busy
    # Admitted (300 ms left of the running call + 300 ms of its own fits 350 ms only as predicted), or
    # refused at once when the prediction says it cannot make it: either way a clear, retry-safe answer.
    assert (status, body["error"]["code"]) in ((504, "DEADLINE_EXCEEDED"), (503, "SERVICE_OVERLOADED"))
    assert "late" not in served.workers[0].backend.gpu.computed


async def test_naming_a_generation_model_on_an_embedding_route_says_what_it_is(http):
    """`/v1/models` lists a generation model; naming it on `/v1/embeddings` or `/tokenize` is a 404 that
    says it is one (it said "no model named"), and a name nothing holds is still "no ... named"."""
    models = (ModelConfig(name="emb", backend="tests.fakes:fake_embedder", options={"latency_ms": 5}),
              ModelConfig(name="gen", kind="generation", backend="inferd.backends.echo_engine"))
    async with running_server(*models) as srv:
        for path, body in (("/v1/embeddings", {"model": "gen", "input": "x"}), ("/tokenize", {"model": "gen", "inputs": "x"})):
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                answer = await resp.json()
            assert resp.status == 404, answer
            message = answer["error"]["message"] if isinstance(answer["error"], dict) else answer["message"]
            assert "'gen' names a generation model gen" in message, message
        async with http.post(f"{srv.url}/v1/embeddings", json={"model": "nothing", "input": "x"}) as resp:
            answer = await resp.json()
        assert resp.status == 404 and "no embedding model named 'nothing'" in answer["error"]["message"]
