"""`/v1/inference` and `/v1/embeddings` in-process (`wiring`): each caller gets its own answer with its
timings, and every refusal is a JSON error with its stable code, in the route's shape."""

from __future__ import annotations

import asyncio

from inferd.backends.sim import expected_output
from inferd.lifecycle import Phase

from .wiring import sim, wired


async def test_concurrent_callers_each_get_their_own_output_from_shared_batches():
    async with wired(sim(options={"latency_ms": 20})) as w:
        async def call(i: int):  # type: ignore[no-untyped-def]
            resp = await w.client.post("/v1/inference", json={"input": f"text {i}"}, headers={"X-Request-ID": f"c-{i}"})
            return resp.status, resp.headers, await resp.json()

        answers = await asyncio.gather(*(call(i) for i in range(24)))
        for i, (status, headers, body) in enumerate(answers):
            assert status == 200 and body["output"] == expected_output(f"text {i}")
            assert body["request_id"] == headers["X-Request-ID"] == f"c-{i}" and body["model"] == "m"
            assert headers["X-Model-Version"] == body["model_version"] == "1" and body["latency_ms"] > 0
            assert round(body["latency_ms"], 3) == body["latency_ms"]  # (to the µs)
            assert "queue;dur=" in headers["Server-Timing"] and "compute;dur=" in headers["Server-Timing"]
        assert max(w.models["m"].stats.batch_sizes) > 1  # (batched together, and still each its own answer)


async def test_bad_calls_are_refused_with_their_codes_and_nothing_is_queued():
    async with wired(max_body_bytes=256) as w:
        cases = [
            (b"not json", 400, "INVALID_INPUT"),
            (b'{"input": 3}', 400, "INVALID_INPUT"),
            (b'["a list"]', 400, "INVALID_INPUT"),
            (b'{"input": "x", "timeout_ms": -1}', 400, "INVALID_INPUT"),
            (b'{"input": "x", "model": "nope"}', 404, "MODEL_NOT_FOUND"),
            (b'{"input": "x", "model": "m@9"}', 404, "MODEL_NOT_FOUND"),
            (b'{"input": "' + b"x" * 300 + b'"}', 413, "PAYLOAD_TOO_LARGE"),
        ]
        for body, status, code in cases:
            resp = await w.client.post("/v1/inference", data=body, headers={"Content-Type": "application/json"})
            answer = await resp.json()
            assert (resp.status, answer["error"]) == (status, code), body
            assert answer["request_id"] == resp.headers["X-Request-ID"] and answer["message"]
        assert w.models["m"].batcher.depth == 0 and sum(w.models["m"].stats.batch_sizes.values()) == 0


async def test_embeddings_from_a_model_that_makes_none_is_a_400_in_openais_shape():
    async with wired() as w:
        resp = await w.client.post("/v1/embeddings", json={"input": ["a", "b"], "model": "m"})
        body = await resp.json()
        assert resp.status == 400 and body["error"]["code"] == "INVALID_INPUT"
        assert "does not produce embeddings" in body["error"]["message"]


async def test_a_draining_server_refuses_new_calls_and_closes_the_connection():
    async with wired() as w:
        w.lifecycle.phase = Phase.DRAINING
        resp = await w.client.post("/v1/inference", json={"input": "late"})
        body = await resp.json()
        assert resp.status == 503 and body["error"] == "DRAINING" and body["retry_after_ms"] > 0
        assert resp.headers.get("Connection", "").lower() == "close"
