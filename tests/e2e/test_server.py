"""The batching server end to end: real HTTP on loopback against the real server."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import aiohttp
import pytest

from inferd.backends.sim import expected_output

from ..helpers import backend_of, infer, running_server, sim_model, until


async def test_2000_concurrent_requests_each_get_their_own_output(http):
    async with running_server(sim_model(latency_ms=20, max_batch_size=100, max_queue=5000)) as srv:
        inputs = [f"input-{i}-{'x' * (i % 37)}" for i in range(2000)]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": text}) for text in inputs))
        for text, (status, body, headers) in zip(inputs, results, strict=False):
            assert status == 200, body
            assert body["output"] == expected_output(text)
            assert body["model"] == "m"
            assert headers["X-Request-ID"] == body["request_id"]
        assert len({body["request_id"] for _, body, _ in results}) == 2000
        sim = backend_of(srv)
        assert sum(size for _, _, size in sim.calls) == 2000 + 1  # + the warm-up input
        assert sim.computed["input-7-xxxxxxx"] == 1


async def test_batches_form_under_load_and_never_exceed_the_limit(http):
    async with running_server(sim_model(latency_ms=30, max_batch_size=16, max_wait_ms=10)) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"q{i}"}) for i in range(300)))
        assert all(status == 200 for status, _, _ in results)
        sizes = [size for _, _, size in backend_of(srv).calls[1:]]
        assert max(sizes) == 16
        assert sum(sizes) / len(sizes) > 4  # the sim raises if batches overlap or exceed its limit


async def test_two_workers_run_two_batches_at_once(http):
    model = sim_model(latency_ms=80, max_batch_size=8, workers=2)
    async with running_server(model) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"w{i}"}) for i in range(64)))
        assert all(status == 200 for status, _, _ in results)
        calls = [(s, e, "a") for s, e, _ in backend_of(srv, worker=0).calls[1:]]
        calls += [(s, e, "b") for s, e, _ in backend_of(srv, worker=1).calls[1:]]
        assert {tag for _, _, tag in calls} == {"a", "b"}
        overlapping = any(
            a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for i, a in enumerate(calls) for b in calls[i + 1 :]
        )
        assert overlapping, "with two workers, two batches should have run at the same time"


async def test_a_lone_request_goes_at_once_instead_of_lingering_for_nobody(http):
    async with running_server(sim_model(latency_ms=10, max_wait_ms=300)) as srv:
        for i in range(3):
            status, body, headers = await infer(http, srv.url, {"input": f"lone{i}"})
            assert status == 200
            timing = dict(part.strip().split(";dur=") for part in headers["Server-Timing"].split(","))
            assert float(timing["queue"]) < 100, headers["Server-Timing"]  # not the 300 ms linger
        assert srv.models["m"].batcher.flushes["sparse"] == 3


async def test_requests_that_waited_do_not_linger_again(http):
    """Arrivals during a busy batch go out as soon as the worker is free, not a linger later."""
    async with running_server(sim_model(latency_ms=150, max_wait_ms=100, max_batch_size=50)) as srv:
        first = asyncio.create_task(infer(http, srv.url, {"input": "first"}))
        await until(lambda: srv.models["m"].workers[0].current is not None)  # the first batch (after its linger) runs
        second = await infer(http, srv.url, {"input": "second"})
        assert (await first)[0] == 200 and second[0] == 200
        timing = dict(p.strip().split(";dur=") for p in second[2]["Server-Timing"].split(","))
        # It waited for the running batch (~120 ms) but not for a further 100 ms linger.
        assert float(timing["queue"]) < 150 + 60, second[2]["Server-Timing"]
        assert srv.models["m"].batcher.flushes["idle_worker"] >= 1


async def test_closed_loop_clients_split_in_two_groups_merge_back_into_full_batches(http):
    """Two groups of closed-loop clients, one batch together, started out of step: each group would run
    half a batch in turn for ever (each is stale when the worker frees); the worker instead waits for
    the echo of the batch it just finished, and the groups merge. (The rule itself, cycle by cycle, is
    `tests/unit/scheduling/test_echo.py`'s on the fake clock. Here the batches are long beside a busy
    host's turnaround, so that the clients come back within a quarter of a cycle and a linger there too.)"""
    async with running_server(sim_model(latency_ms=400, max_batch_size=20, max_wait_ms=120)) as srv:
        stop_at = time.monotonic() + 4.5

        async def client(i: int) -> None:
            while time.monotonic() < stop_at:
                status, body, _ = await infer(http, srv.url, {"input": f"c{i}"})
                assert status == 200 and body["output"] == expected_output(f"c{i}")

        group_a = [asyncio.create_task(client(i)) for i in range(10)]
        await until(lambda: srv.models["m"].workers[0].current is not None)  # group A's batch left without B
        group_b = [asyncio.create_task(client(i)) for i in range(10, 20)]
        await asyncio.gather(*group_a, *group_b)
        sizes = [size for _, _, size in backend_of(srv).calls]
        assert sizes[0] < 20, sizes  # they really were split
        assert srv.models["m"].batcher.echo.holds >= 1
        assert sizes[-3:].count(20) >= 2, sizes  # merged: the last batches are full


@pytest.mark.parametrize("fast_path", [True, False])
async def test_each_request_names_the_connection_it_came_on(fast_path: bool):
    """What the closed-loop echo waits for (`scheduling.arrivals`): the connection of each request, the
    same object for the requests of one keep-alive connection, another for another connection, on the
    fast path and on the handler's way alike."""
    async with running_server(sim_model(latency_ms=5), fast_path=fast_path) as srv:
        batcher = srv.models["m"].batcher
        seen: list = []
        submit = batcher.submit
        batcher.submit = lambda request: seen.append(request.client) or submit(request)  # type: ignore[method-assign]
        for _ in range(2):  # (two sessions: two connections, each kept alive for two requests)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
                for i in range(2):
                    status, _, _ = await infer(one, srv.url, {"input": f"c{len(seen)}-{i}"})
                    assert status == 200
        first, second = seen[:2], seen[2:4]
        assert first[0] is not None and first[0] is first[1] and second[0] is second[1] and first[0] is not second[0]


async def test_any_plain_batch_function_works(http):
    model = sim_model(backend="inferd.backends.sim:batchstring", options={})
    async with running_server(model) as srv:
        status, body, _ = await infer(http, srv.url, {"input": "E equals ", "model": "m"})
        assert status == 200 and body["output"] == expected_output("E equals ")


async def test_default_model_is_the_first_and_alias_path_works(http):
    async with running_server(sim_model("first"), sim_model("second")) as srv:
        status, body, _ = await infer(http, srv.url, {"input": "a"})
        assert status == 200 and body["model"] == "first"
        async with http.post(f"{srv.url}/api/inference", json={"input": "b", "model": "second"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == "second"


async def test_client_request_id_round_trips(http):
    async with running_server() as srv:
        _, body, headers = await infer(http, srv.url, {"input": "a"}, headers={"X-Request-ID": "client-42"})
        assert body["request_id"] == headers["X-Request-ID"] == "client-42"
        _, body, _ = await infer(http, srv.url, {"input": "a"}, headers={"X-Request-ID": "bad id with spaces"})
        assert body["request_id"].startswith("req_")


async def test_operational_endpoints(http):
    async with running_server(sim_model(max_batch_size=7, workers=2)) as srv:
        async with http.get(f"{srv.url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200 and (await resp.json())["ready"] is True
        async with http.get(f"{srv.url}/v1/models") as resp:
            (model,) = (await resp.json())["data"]
            assert (model["name"], model["max_batch_size"], model["workers"]) == ("m", 7, 2)
        async with http.get(f"{srv.url}/v1/stats") as resp:
            assert (await resp.json())["process"]["cpu_seconds"] > 0


async def test_disconnected_client_is_removed_from_the_queue(http):
    model = sim_model(latency_ms=300, max_batch_size=1, max_wait_ms=0)
    async with running_server(model) as srv:
        busy = asyncio.create_task(infer(http, srv.url, {"input": "occupies-the-worker"}))
        await until(lambda: srv.models["m"].workers[0].current is not None)
        leaving = asyncio.create_task(infer(http, srv.url, {"input": "goes-away"}))
        await until(lambda: srv.models["m"].batcher.depth == 1)
        leaving.cancel()  # the client goes away while its request is queued
        await until(lambda: srv.models["m"].batcher.depth == 0)  # removed at once, not when its turn came
        assert srv.models["m"].workers[0].current is not None  # (the busy batch is still running)
        assert (await busy)[0] == 200
        await infer(http, srv.url, {"input": "after"})
        assert backend_of(srv).computed["goes-away"] == 0
        assert backend_of(srv).computed["after"] == 1


async def test_grace_drain_answers_admitted_requests_before_stopping(http):
    async with running_server(sim_model(latency_ms=200, max_batch_size=4, max_wait_ms=0)) as srv:
        tasks = [asyncio.create_task(infer(http, srv.url, {"input": f"d{i}"})) for i in range(10)]
        await until(lambda: srv.lifecycle.in_flight == 10)  # all ten admitted
        started = time.monotonic()
        drained = await srv.drain_and_stop()
        results = await asyncio.gather(*tasks)
        assert drained and time.monotonic() - started >= 0.4  # three batches of four had to run
        assert [status for status, _, _ in results] == [200] * 10


async def test_a_request_deadline_flushes_before_the_linger_would_miss_it(http):
    async with running_server(sim_model(latency_ms=50, max_wait_ms=400)) as srv:
        await asyncio.gather(*(infer(http, srv.url, {"input": f"busy{i}"}) for i in range(64)))  # arrivals are frequent
        status, _, _ = await infer(http, srv.url, {"input": "hurry", "timeout_ms": 200})
        assert status == 200  # (within its 200 ms, where the 400 ms linger would have missed it: else a 504)
        assert srv.models["m"].batcher.flushes["deadline"] == 1


async def test_the_models_threads_run_below_the_event_loop_in_cpu_priority(http):
    # `[server] worker_nice`: the preparing and the executor thread each lower their own nice value; a
    # backend's `execute_nice` lowers its executor (and the threads it starts) once built, the larger of
    # the two counting.
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for worker_nice, execute_nice in ((3, 0), (0, 0), (0, 4), (6, 4)):
        model = sim_model(backend="tests.fakes:thread_nice", options={"execute_nice": execute_nice})
        async with running_server(model, worker_nice=worker_nice) as srv:
            status, body, _ = await infer(http, srv.url, {"input": "a"})
        prepared, computed = (min(19, loop_nice + n) for n in (worker_nice, max(worker_nice, execute_nice)))
        assert status == 200 and body["output"] == f"a prepared at {prepared} computed at {computed} started at {computed}", body
