"""Every request ends with an answer: each error code from a real HTTP request."""

from __future__ import annotations

import asyncio

import pytest

from inferd.backends.sim import expected_output

from ..helpers import backend_of, infer, running_server, sim_model, until


def assert_error(status: int, body: dict, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    assert body["error"] == code, body
    assert body["message"] and body["request_id"]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"inpt": "x"}',
        b'{"input": 5}',
        b'{"input": "x", "model": 3}',
        b'{"input": "x", "timeout_ms": 0}',
        b'{"input": "x", "timeout_ms": -5}',
        b'{"input": "x", "timeout_ms": 1.5}',
        b'{"input": "x", "timeout_ms": true}',
        b'{"input": "\xff\xfe"}',
        b'{"input": "\\ud800"}',
        b"",
    ],
)
async def test_bad_bodies_get_400(http, body):
    async with running_server() as srv:
        status, payload, _ = await infer(http, srv.url, body)
        assert_error(status, payload, 400, "INVALID_INPUT")


async def test_input_longer_than_the_model_limit_gets_400(http):
    async with running_server(sim_model(max_input_chars=10)) as srv:
        status, payload, _ = await infer(http, srv.url, {"input": "x" * 11})
        assert_error(status, payload, 400, "INVALID_INPUT")
        assert (await infer(http, srv.url, {"input": "x" * 10}))[0] == 200


async def test_unknown_model_gets_404(http):
    async with running_server() as srv:
        status, payload, _ = await infer(http, srv.url, {"input": "x", "model": "nope"})
        assert_error(status, payload, 404, "MODEL_NOT_FOUND")


async def test_wrong_paths_and_methods_get_json(http):
    async with running_server() as srv:
        async with http.get(f"{srv.url}/nowhere") as resp:
            assert_error(resp.status, await resp.json(), 404, "NOT_FOUND")
        async with http.get(f"{srv.url}/v1/inference") as resp:
            assert_error(resp.status, await resp.json(), 405, "METHOD_NOT_ALLOWED")
            assert resp.headers["Allow"] == "POST"
        # HEAD: the same head, no body (the next answer on the connection is read right)
        host, port = srv.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HEAD /v1/inference HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 405") and b"Content-Length: " in head
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_body_over_the_limit_gets_413(http):
    async with running_server(max_body_bytes=1024) as srv:
        status, payload, _ = await infer(http, srv.url, {"input": "x" * 2000})
        assert_error(status, payload, 413, "PAYLOAD_TOO_LARGE")


async def test_full_queue_gets_503_with_retry_after_and_nothing_hangs(http):
    model = sim_model(latency_ms=100, max_batch_size=2, max_wait_ms=0, max_queue=4)
    async with running_server(model) as srv:
        results = await asyncio.wait_for(
            asyncio.gather(*(infer(http, srv.url, {"input": f"o{i}"}) for i in range(40))), timeout=20
        )
        statuses = [status for status, _, _ in results]
        assert set(statuses) == {200, 503}
        assert statuses.count(200) >= 4
        for status, payload, headers in results:
            if status == 503:
                assert_error(status, payload, 503, "SERVICE_OVERLOADED")
                assert payload["retry_after_ms"] >= 1
                assert int(headers["Retry-After"]) >= 1


def slow_on_marker(**kw):
    """Batches holding SLOW take 600 ms more than the model's usual 20 ms: a request admitted on the usual
    figure then waits far longer than predicted."""
    return sim_model(backend="inferd.backends.faulty:create", latency_ms=20, max_batch_size=1, max_wait_ms=0,
                     options={"slow_marker": "SLOW", "slow_ms": 600}, **kw)


async def test_deadline_gives_504_and_the_expired_request_is_never_computed(http):
    async with running_server(slow_on_marker()) as srv:
        busy = asyncio.create_task(infer(http, srv.url, {"input": "SLOW occupies-the-worker"}))
        await until(lambda: srv.models["m"].workers[0].current is not None)
        status, payload, _ = await infer(http, srv.url, {"input": "too-late", "timeout_ms": 200})
        assert_error(status, payload, 504, "DEADLINE_EXCEEDED")
        assert "while queued" in payload["message"]
        assert (await busy)[0] == 200
        await infer(http, srv.url, {"input": "next"})
        assert backend_of(srv).computed["too-late"] == 0


async def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once(http):
    async with running_server(sim_model(latency_ms=200, max_batch_size=1, max_wait_ms=0)) as srv:
        status, payload, headers = await infer(http, srv.url, {"input": "hopeless", "timeout_ms": 50})
        assert_error(status, payload, 503, "SERVICE_OVERLOADED")
        assert "deadline" in payload["message"] and payload["retry_after_ms"] >= 1
        assert backend_of(srv).computed["hopeless"] == 0


async def test_timeout_above_the_maximum_is_capped(http):
    async with running_server(slow_on_marker(timeout_ms=100, max_timeout_ms=150)) as srv:
        busy = asyncio.create_task(infer(http, srv.url, {"input": "SLOW busy", "timeout_ms": 150}))
        await until(lambda: srv.models["m"].workers[0].current is not None)
        started = asyncio.get_running_loop().time()
        status, payload, _ = await infer(http, srv.url, {"input": "capped", "timeout_ms": 10**9})
        assert_error(status, payload, 504, "DEADLINE_EXCEEDED")
        assert asyncio.get_running_loop().time() - started < 0.5  # 150 ms, not a billion
        assert (await busy)[0] == 504  # its own 150 ms ran out during the 620 ms batch


async def test_backend_error_gives_500_for_that_batch_only(http):
    model = sim_model(
        backend="inferd.backends.faulty:create", latency_ms=50, max_batch_size=1, max_wait_ms=0,
        options={"fail_marker": "POISON"},
    )
    async with running_server(model) as srv:
        bad, good = await asyncio.gather(
            infer(http, srv.url, {"input": "POISON pill"}), infer(http, srv.url, {"input": "fine"})
        )
        assert_error(bad[0], bad[1], 500, "INFERENCE_FAILED")
        assert good[0] == 200


async def test_wrong_length_output_fails_the_batch_and_shifts_nothing(http):
    """Five inputs in one batch (it goes only when full), one output missing: nobody gets a neighbour's
    output; the whole batch fails, and the next batch is fine."""
    model = sim_model(
        backend="inferd.backends.faulty:create", latency_ms=30, max_batch_size=5, max_wait_ms=60_000,
        max_isolation_calls=0, options={"wrong_length_marker": "SHORT", "max_batch_size": 5},
    )
    async with running_server(model) as srv:
        inputs = ["a", "b", "SHORT", "c", "d"]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in inputs))
        assert srv.models["m"].stats.batch_sizes == {5: 1}  # one batch of the five
        for status, payload, _ in results:
            assert_error(status, payload, 500, "INFERENCE_FAILED")
            assert "4 outputs for 5 inputs" in payload["message"]
        after = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in "vwxyz"))
        assert [p["output"] for _, p, _ in after] == [expected_output(t) for t in "vwxyz"]


async def test_not_ready_until_warm_up_ends(http):
    model = sim_model(backend="inferd.backends.faulty:create", options={"startup_delay_ms": 800})
    async with running_server(model, wait_ready=False) as srv:
        status, payload, headers = await infer(http, srv.url, {"input": "early"})
        assert_error(status, payload, 503, "NOT_READY")
        assert payload["retry_after_ms"] > 0 and "Retry-After" in headers
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503
        await srv.wait_ready(10)
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200
        assert (await infer(http, srv.url, {"input": "later"}))[0] == 200


async def test_draining_refuses_new_requests_with_503_and_connection_close(http):
    async with running_server(sim_model(latency_ms=300, max_batch_size=1, max_wait_ms=0)) as srv:
        busy = asyncio.create_task(infer(http, srv.url, {"input": "admitted"}))
        await until(lambda: srv.models["m"].workers[0].current is not None)
        drain = asyncio.create_task(srv.drain_and_stop())
        await until(lambda: srv.lifecycle.draining)
        status, payload, headers = await infer(http, srv.url, {"input": "late"})
        assert_error(status, payload, 503, "DRAINING")
        assert headers.get("Connection", "").lower() == "close"
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503
        assert (await busy)[0] == 200
        assert await drain
