"""The connection's fast path (`inferd.http.fast_path`): the same answers as the handler's on every route
it takes (one-input inference and every dialect of a call of several inputs), in order on a
connection, nothing computed for a client that left, and the connection's timers (keep-alive, headers)
as they are for the usual way."""

from __future__ import annotations

import asyncio
import hashlib
import time

import orjson
import pytest

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig, TenantConfig, TierConfig
from inferd.http.fast_path import BODY_GRACE_S

from ..helpers import RecordingTransport, backend_of, running_server, sim_model, until
from .test_connections import connect

KEY = "k-fast-path"


async def _raw(url: str, raw: bytes, answers: int = 1, timeout_s: float = 5.0) -> list[tuple[int, dict[str, str], dict]]:
    """Send `raw` on one connection; read `answers` answers off it (status, headers, JSON body)."""
    reader, writer = await connect(url)
    writer.write(raw)
    out = []
    try:
        for _ in range(answers):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout_s)
            json = headers["content-type"].startswith("application/json")
            out.append((int(lines[0].split()[1]), headers, orjson.loads(body) if json else body))
    finally:
        writer.close()
    return out


def _post(body: bytes, *headers: str, path: str = "/v1/inference") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path.encode(), extra.encode(), len(body), body)


CASES = [  # (the request, what its answer must say)
    (_post(b'{"input": "same either way"}', f"Authorization: Bearer {KEY}", "X-Request-ID: fp-1"), 200),
    (_post(b'{"input": 5}', f"Authorization: Bearer {KEY}", "X-Request-ID: fp-2"), 400),
    (_post(b'{"input": "x", "model": "nope"}', f"Authorization: Bearer {KEY}", "X-Request-ID: fp-3"), 404),
    (_post(b'{"input": "x"}', "Authorization: Bearer wrong", "X-Request-ID: fp-4"), 401),
    (_post(b"not json", f"Authorization: Bearer {KEY}", "X-Request-ID: fp-5"), 400),
    (_post(b'{"input": "' + b"y" * 300 + b'"}', f"Authorization: Bearer {KEY}", "X-Request-ID: fp-6"), 413),
]


@pytest.mark.parametrize("fast_path", [True, False])
async def test_answers_are_the_same_with_and_without_the_fast_path(fast_path):
    tenants = (TenantConfig("t", "free", hashlib.sha256(KEY.encode()).hexdigest()),)
    async with running_server(sim_model(latency_ms=5), auth=AuthConfig(enabled=True), tenants=tenants,
                              tiers=(TierConfig("free"),), fast_path=fast_path, max_body_bytes=200) as srv:
        for raw, status in CASES:
            ((got, headers, body),) = await _raw(srv.url, raw)
            assert got == status, body
            assert headers["x-request-id"] == body["request_id"] and body["request_id"].startswith("fp-")
            assert headers["content-type"] == "application/json" and "date" in headers and headers["server"] == "inferd"
            if status == 200:
                assert body["output"] == expected_output("same either way") and body["model"] == "m"
                assert headers["x-model-version"] == "1" and headers["server-timing"].startswith("queue;dur=")
            else:
                assert isinstance(body["error"], str) and body["message"]
        answered = {(model, code) for (model, _, _, code, _), n in srv.models["m"].metrics.requests.items() if n}
        assert answered == {("m", 200), ("-", 400), ("-", 404), ("-", 401), ("-", 413)}  # ("-": before a model is known)
        assert (srv.api.fast_path.taken if fast_path else srv.api.fast_path) == (len(CASES) if fast_path else None)


async def test_requests_on_one_connection_are_answered_in_order_each_with_its_own_output():
    async with running_server(sim_model(latency_ms=60, max_wait_ms=0)) as srv:
        # Two in one write (the second waits behind the first), then one sent while the first is computed.
        raw = _post(b'{"input": "first"}') + _post(b'{"input": "second"}')
        reader, writer = await connect(srv.url)
        writer.write(raw)
        await until(lambda: backend_of(srv).computed["first"] == 1 or srv.lifecycle.in_flight > 0)
        writer.write(_post(b'{"input": "third"}'))
        outputs = []
        for _ in range(3):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            outputs.append(orjson.loads(await reader.readexactly(length))["output"])
        writer.close()
        assert outputs == [expected_output(x) for x in ("first", "second", "third")]


async def test_a_client_that_leaves_has_its_input_withdrawn_and_counted():
    async with running_server(sim_model(latency_ms=300, max_batch_size=1, max_wait_ms=0)) as srv:
        busy = asyncio.create_task(_raw(srv.url, _post(b'{"input": "occupies-the-worker"}')))
        await until(lambda: srv.models["m"].workers[0].current is not None)
        reader, writer = await connect(srv.url)
        writer.write(_post(b'{"input": "goes-away"}'))
        await until(lambda: srv.models["m"].batcher.depth == 1)
        writer.close()  # gone while its request is queued
        await until(lambda: srv.models["m"].batcher.depth == 0)
        assert (await busy)[0][0] == 200
        await until(lambda: srv.lifecycle.in_flight == 0)
        assert backend_of(srv).computed["goes-away"] == 0
        assert sum(n for (_, _, _, code, error), n in srv.models["m"].metrics.requests.items()
                   if (code, error) == (499, "CLIENT_DISCONNECTED")) == 1


async def test_a_request_longer_than_the_keepalive_timeout_is_not_cut_off():
    # The keep-alive timer armed after the first answer fires while the second is computed.
    async with running_server(sim_model(latency_ms=400, max_wait_ms=0), keepalive_timeout_s=0.5) as srv:
        reader, writer = await connect(srv.url)
        for text in ("one", "two"):
            writer.write(_post(b'{"input": "%s"}' % text.encode()))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert orjson.loads(await reader.readexactly(length))["output"] == expected_output(text)
            await asyncio.sleep(0.3)
        started = time.monotonic()  # idle past the timeout now: the server closes it
        assert await asyncio.wait_for(reader.read(), 5) == b"" and time.monotonic() - started < 2
        writer.close()


async def test_connection_close_and_http_1_0_are_answered_then_closed():
    async with running_server(sim_model(latency_ms=5)) as srv:
        for raw in (_post(b'{"input": "close"}', "Connection: close"),
                    _post(b'{"input": "old"}').replace(b"HTTP/1.1", b"HTTP/1.0")):
            reader, writer = await connect(srv.url)
            writer.write(raw)
            data = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed it
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
            assert orjson.loads(body)["output"].startswith(orjson.loads(raw.partition(b"\r\n\r\n")[2])["input"])
            writer.close()


async def test_a_drain_waits_for_requests_the_fast_path_holds():
    async with running_server(sim_model(latency_ms=200, max_batch_size=4, max_wait_ms=0)) as srv:
        tasks = [asyncio.create_task(_raw(srv.url, _post(b'{"input": "d%d"}' % i))) for i in range(6)]
        await until(lambda: srv.lifecycle.in_flight == 6)
        assert await srv.drain_and_stop()
        answers = [a[0] for a in await asyncio.gather(*tasks)]
        assert [(status, body["output"]) for status, _, body in answers] == [
            (200, expected_output(f"d{i}")) for i in range(6)]


@pytest.mark.parametrize("pause_s", [0.005, 0.2])
async def test_a_body_written_apart_from_its_headers_is_answered_either_way(pause_s):
    # (aiohttp's client writes the two apart: the connection holds the request for its body's next read,
    # up to BODY_GRACE_S; later than that, aiohttp's loop reads the rest.)
    async with running_server(sim_model(latency_ms=5)) as srv:
        raw = _post(b'{"input": "in two pieces"}')
        head, _, body = raw.partition(b"\r\n\r\n")
        reader, writer = await connect(srv.url)
        writer.write(head + b"\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(pause_s)
        writer.write(body)
        head_in = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head_in.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answer = orjson.loads(await reader.readexactly(length))
        writer.close()
        assert head_in.startswith(b"HTTP/1.1 200") and answer["output"] == expected_output("in two pieces")
        assert srv.api.fast_path.taken == (1 if pause_s < BODY_GRACE_S else 0)


async def test_requests_pipelined_behind_one_taken_between_aiohttps_answers_wait_their_turn():
    # aiohttp's loop answers the first request (a query string: the usual way); the second comes right
    # after its answer, before that loop waits again, and the fast path takes it; the third (a 400, answered
    # at once) is pipelined behind the second and must not be answered before it, though aiohttp's loop is free.
    async with running_server(sim_model(latency_ms=100, max_wait_ms=0)) as srv:
        loop = asyncio.get_running_loop()
        connection = srv.connections()
        transport = RecordingTransport()
        connection.connection_made(transport)
        await asyncio.sleep(0.01)  # (its request loop waits for a first request)

        def next_two() -> None:  # (scheduled now: runs before aiohttp's loop resumes after this answer)
            transport.on_write = None
            connection.data_received(_post(b'{"input": "second"}'))
            connection.data_received(_post(b'{"input": 3}'))

        transport.on_write = lambda: loop.call_soon(next_two)
        connection.data_received(_post(b'{"input": "first"}').replace(b"/v1/inference", b"/v1/inference?q=1"))
        await until(lambda: transport.out.count(b"HTTP/1.1 ") == 3, timeout_s=5)
        answers = [(part[:3], orjson.loads(part.split(b"\r\n\r\n", 1)[1]))
                   for part in bytes(transport.out).split(b"HTTP/1.1 ")[1:]]
        assert [status for status, _ in answers] == [b"200", b"200", b"400"]
        assert [body.get("output") for _, body in answers[:2]] == [expected_output("first"), expected_output("second")]
        assert srv.api.fast_path.taken >= 1
        connection.connection_lost(None)


async def test_a_bug_writing_the_answer_is_a_500_for_that_request_alone():
    async with running_server(sim_model(latency_ms=5)) as srv:
        inference, answered = srv.api.fast_path.inference, srv.api.fast_path.inference.answered

        def broken(one, output):
            if one.parsed.input == "breaks":
                raise TypeError("an output JSON cannot hold")
            return answered(one, output)

        inference.answered = broken
        ((status, _, body),) = await _raw(srv.url, _post(b'{"input": "breaks"}', "X-Request-ID: fp-bug"))
        assert (status, body["error"], body["request_id"]) == (500, "INTERNAL_ERROR", "fp-bug")
        ((status, _, body),) = await _raw(srv.url, _post(b'{"input": "fine"}'))
        assert status == 200 and body["output"] == expected_output("fine")
        await until(lambda: srv.lifecycle.in_flight == 0)


DIALECT_CASES = [  # (path, body, the status its answer must have): every route of several inputs, both ways
    ("/v1/embeddings", b'{"model": "emb", "input": "one text"}', 200),
    ("/v1/embeddings", b'{"model": "emb", "input": ["a", "bb", "ccc"], "encoding_format": "base64"}', 200),
    ("/v1/embeddings", b'{"model": "emb", "input": ["a", ""]}', 400),
    ("/v1/embeddings", b'{"model": "nope", "input": "x"}', 404),
    ("/v1/embeddings", b'{"model": "rr", "input": "x"}', 400),
    ("/v1/embeddings", b"not json", 400),
    ("/embed", b'{"inputs": ["a", "b"]}', 200),
    ("/embed", b'{"inputs": "a", "normalize": 3}', 400),
    ("/", b'{"inputs": "the root"}', 200),
    ("/embed_all", b'{"model": "short", "inputs": ["fits", [2000, 2001]]}', 200),
    ("/embed_all", b'{"inputs": "a"}', 400),  # (the default embedding model gives no per-token vectors)
    ("/v2/embed", b'{"model": "emb", "texts": ["a", "b"], "embedding_types": ["float", "int8"]}', 200),
    ("/v2/embed", b'{"model": "emb", "texts": []}', 400),
    ("/v1/classify", b'{"model": "clf", "input": ["fine", "bad"]}', 200),
    ("/predict", b'{"model": "clf", "inputs": "fine"}', 200),
    ("/v1/rerank", b'{"model": "rr", "query": "q", "documents": ["a", "b", "c"]}', 200),
    ("/rerank", b'{"model": "rr", "query": "q", "texts": ["a", "b"]}', 200),
    ("/rerank", b'{"model": "rr", "query": "q"}', 400),
    ("/v1/embeddings", b'{"model": "emb", "input": ["' + b"z" * 300 + b'"]}', 413),
    # One input refused by the model's own preparation (too long, not truncated): the call's first error.
    ("/v1/embeddings", b'{"model": "short", "input": ["fits", "far too many words for eight tokens", "fits too"]}', 400),
    ("/v2/models/emb/infer", b'{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}', 200),
    ("/v2/models/emb/versions/1/infer", b'{"id": "c-1", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", '
     b'"data": ["a"]}], "outputs": [{"name": "output", "parameters": {"binary_data": true}}]}', 200),
    ("/v2/models/emb/infer", b'{"inputs": []}', 400),
    ("/v2/models/nope/infer", b'{"inputs": []}', 404),  # (no such model: the usual way answers it)
]
HANDED_ON = 1  # (the cases above that the fast path leaves to the usual way)


def _dialect_models(tmp_path_factory) -> tuple:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from inferd.backends.small_models import build_classifier, build_cross_encoder
    from inferd.config import ModelConfig

    reranker = str(build_cross_encoder(tmp_path_factory.mktemp("rr")))
    classifier = str(build_classifier(tmp_path_factory.mktemp("clf")))
    return (
        sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=5),  # (first: TEI's `POST /` embeds)
        ModelConfig(name="rr", backend="inferd.backends.transformer:create", max_wait_ms=5,
                    options={"model_path": reranker, "task": "rerank", "max_tokens": 32, "bucket_edges": [32]}),
        ModelConfig(name="clf", backend="inferd.backends.transformer:create", max_wait_ms=5,
                    options={"model_path": classifier, "task": "classification", "max_tokens": 32, "bucket_edges": [32]}),
        ModelConfig(name="short", backend="inferd.backends.transformer:create", max_wait_ms=5,
                    options={"max_tokens": 8, "truncate": False, "bucket_edges": [8]}),  # (the packaged MiniLM)
    )


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal, floats within 1e-5: a cross-encoder's scores move in the last digits with how its pairs
    happened to be batched (padding), whichever way the call came in."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _timing_names(value: str | None) -> list[str]:
    return [entry.strip().split(";")[0] for entry in value.split(",")] if value else []


async def test_every_dialect_answers_the_same_with_and_without_the_fast_path(tmp_path_factory):
    """Status, headers (but their timings' values and the date), bodies and records, route by route."""
    models = _dialect_models(tmp_path_factory)
    tenants = (TenantConfig("t", "free", hashlib.sha256(KEY.encode()).hexdigest()),)
    seen: dict[bool, list] = {}
    records: dict[bool, dict] = {}
    for fast_path in (True, False):
        async with running_server(*models, auth=AuthConfig(enabled=True), tenants=tenants, tiers=(TierConfig("free"),),
                                  fast_path=fast_path, max_body_bytes=250, ready_timeout_s=120) as srv:
            answers = []
            for n, (path, body, status) in enumerate(DIALECT_CASES):
                ((got, headers, answer),) = await _raw(srv.url, _post(body, f"Authorization: Bearer {KEY}",
                                                                       f"X-Request-ID: fpd-{n}", path=path))
                assert got == status, (path, body, answer)
                kept = {k: v for k, v in headers.items() if k not in ("date", "server-timing", "content-length")}
                if isinstance(answer, dict):
                    answer.pop("created", None)  # (a clock's second)
                answers.append((got, kept, _timing_names(headers.get("server-timing")), answer))
            ((got, _, answer),) = await _raw(srv.url, _post(DIALECT_CASES[0][1], "Authorization: Bearer wrong",
                                                            path="/v1/embeddings"))
            answers.append((got, answer["error"]["code"]))
            too_big = b'{"model": "emb", "input": ["' + b"z" * 300 + b'"]}'  # (the caller is refused first)
            ((got, _, answer),) = await _raw(srv.url, _post(too_big, "Authorization: Bearer wrong", path="/v1/embeddings"))
            answers.append((got, answer["error"]["code"]))
            ((got, _, answer),) = await _raw(srv.url, _post(DIALECT_CASES[-1][1], "Authorization: Bearer wrong",
                                                            path="/v2/models/emb/infer"))  # (left to the usual way)
            answers.append((got, answer["code"]))
            await until(lambda: srv.lifecycle.in_flight == 0)
            seen[fast_path] = answers
            records[fast_path] = {key: n for model in models
                                  for key, n in srv.models[model.name].metrics.requests.items() if n}
            taken = srv.api.fast_path.taken if fast_path else None
            assert taken == (len(DIALECT_CASES) - HANDED_ON + 2 if fast_path else None)
    for fast, usual, (path, body, _) in zip(seen[True], seen[False], [*DIALECT_CASES, *[("", b"", 0)] * 3], strict=True):
        assert _same(fast, usual), (path, body, fast, usual)
    assert records[True] == records[False]
    assert [answer[0] for answer in seen[True][-3:]] == [401, 401, 401]


async def test_a_call_of_several_inputs_whose_client_leaves_has_them_all_withdrawn():
    async with running_server(sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=300, max_batch_size=1,
                                        max_wait_ms=0)) as srv:
        busy = asyncio.create_task(_raw(srv.url, _post(b'{"input": "occupies"}', path="/v1/embeddings")))
        model = srv.models["emb"]
        await until(lambda: model.workers[0].current is not None)
        reader, writer = await connect(srv.url)
        writer.write(_post(b'{"input": ["gone-1", "gone-2", "gone-3"]}', path="/v1/embeddings"))
        await until(lambda: model.batcher.depth == 3)
        writer.close()  # gone while its inputs are queued
        await until(lambda: model.batcher.depth == 0)
        assert (await busy)[0][0] == 200
        await until(lambda: srv.lifecycle.in_flight == 0)
        computed = backend_of(srv, "emb").gpu.computed
        assert [computed[f"gone-{i}"] for i in (1, 2, 3)] == [0, 0, 0]
        assert srv.api.fast_path.taken == 2
        assert sum(n for (_, _, _, code, error), n in model.metrics.requests.items()
                   if (code, error) == (499, "CLIENT_DISCONNECTED")) == 1

