"""Hung GPUs, crashing batches, poison inputs and dead workers: every request answered exactly once."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import pytest

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig

from .. import fakes
from ..helpers import infer, running_server, sim_model, until

ADMIN_KEY = "admin-secret-key"
ADMIN = AuthConfig(enabled=True, anonymous_tier="default", admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest())


@pytest.fixture(autouse=True)
def _reset_fault_switches():
    fakes.reset()
    yield
    fakes.reset()


def switchable(**kw):
    options = {"latency_ms": kw.pop("latency_ms", 50), "hang_s": kw.pop("hang_s", 3600)}
    return sim_model(backend="tests.fakes:switchable", options=options, **kw)


async def test_a_hung_worker_is_replaced_and_its_batch_served_by_the_other(http):
    model = switchable(latency_ms=50, hang_s=1.5, workers=2, max_batch_size=8, max_wait_ms=5, batch_timeout_ms=300)
    async with running_server(model) as srv:
        served = srv.models["m"]
        started = time.monotonic()
        inputs = ["HANG-1", *[f"ok-{i}" for i in range(7)]]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in inputs))
        elapsed = time.monotonic() - started
        for text, (status, body, _) in zip(inputs, results):
            assert status == 200, body
            assert body["output"] == expected_output(text)
        # the watchdog limit (300 ms) plus one batch on the other worker, with room for a loaded CI box
        assert elapsed < 1.3, elapsed  # the hung call itself only returns at 1.5 s
        assert served.pool.replacements == 1
        (hung,) = [w for w in served.workers if w.name.endswith(".1")]  # the replacement stands in its slot
        await until(lambda: served.pool.healthy == 2)  # the replacement builds and warms up
        assert [w.name for w in served.workers].count("m-0") + [w.name for w in served.workers].count("m-1") == 1
        delivered, answered = served.stats.batches, served.stats.requests_computed
        gone = [t for t in threading.enumerate() if t.name == f"inferd-{hung.name.split('.')[0]}"]
        await until(lambda: bool(fakes.late_results), timeout_s=5)  # the hung call returns at 1.5 s...
        await until(lambda: not any(t.is_alive() for t in gone))  # ...and its thread ends
        assert (served.stats.batches, served.stats.requests_computed) == (delivered, answered)  # its late result went nowhere
        status, body, _ = await infer(http, srv.url, {"input": "after"})
        assert status == 200 and body["output"] == expected_output("after")


async def test_a_poison_input_fails_alone_in_a_batch_of_100_and_is_dead_lettered(http):
    model = sim_model(backend="inferd.backends.faulty:create", latency_ms=5, max_batch_size=100, max_wait_ms=200,
                      max_isolation_calls=32, options={"fail_marker": "POISON", "max_batch_size": 100})
    async with running_server(model, auth=ADMIN) as srv:
        inputs = [f"in-{i}" for i in range(99)] + ["POISON-pill"]
        results = await asyncio.gather(
            *(infer(http, srv.url, {"input": t}, headers={"X-Request-ID": f"r{i}"}) for i, t in enumerate(inputs))
        )
        statuses = [status for status, _, _ in results]
        assert statuses.count(200) == 99 and results[-1][0] == 500
        assert results[-1][1]["error"] == "INFERENCE_FAILED"
        for text, (_status, body, _) in zip(inputs[:99], results[:99]):
            assert body["output"] == expected_output(text)
        assert srv.models["m"].stats.batch_sizes[100] == 1  # they really were one batch
        async with http.get(f"{srv.url}/v1/dead-letters") as resp:
            assert resp.status == 401
        async with http.get(f"{srv.url}/v1/dead-letters", headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 403
        async with http.get(f"{srv.url}/v1/dead-letters", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as resp:
            assert resp.status == 200
            letters = await resp.json()
        (entry,) = letters["entries"]
        assert entry["request_id"] == "r99" and entry["model"] == "m"
        assert entry["input_sha256"] == hashlib.sha256(b"POISON-pill").hexdigest()
        assert entry["input_length"] == len("POISON-pill") and "PoisonInputError" in entry["error"]
        assert "POISON-pill" not in str(letters)


async def test_isolation_stops_at_its_budget_of_extra_calls(http):
    model = sim_model(backend="inferd.backends.faulty:create", latency_ms=5, max_batch_size=16, max_wait_ms=100,
                      max_isolation_calls=2, options={"fail_marker": "POISON", "max_batch_size": 16})
    async with running_server(model) as srv:
        inputs = ["POISON"] + [f"x{i}" for i in range(15)]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in inputs))
        calls = srv.models["m"].workers[0].backend.calls
        assert srv.models["m"].stats.batch_sizes == {16: 1}  # one batch of the sixteen
        assert [size for _, _, size in calls[1:]] == [8]  # of the batch and its two halves, only the clean half ran
        statuses = [s for s, _, _ in results]
        assert statuses[:8] == [500] * 8  # the half holding the poison: no budget left to split it
        assert statuses[8:] == [200] * 8 and [b["output"] for _, b, _ in results[8:]] == [expected_output(t) for t in inputs[8:]]


async def test_breaker_opens_on_a_failing_model_and_closes_after_recovery(http):
    model = switchable(latency_ms=10, max_batch_size=4, max_wait_ms=0, breaker_failures=3, breaker_cooldown_ms=400)
    async with running_server(model) as srv:
        fakes.failing.set()
        for i in range(3):
            status, body, _ = await infer(http, srv.url, {"input": f"f{i}"})
            assert (status, body["error"]) == (500, "INFERENCE_FAILED")
        status, body, headers = await infer(http, srv.url, {"input": "refused"})
        assert (status, body["error"]) == (503, "MODEL_UNAVAILABLE")  # (the breaker's: refused at admission, not queued)
        assert 0 < body["retry_after_ms"] <= 400 and "Retry-After" in headers
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503 and (await resp.json())["models"]["m"]["breaker"] == "open"
        breaker = srv.models["m"].breaker
        await until(lambda: breaker.refusal_s(time.monotonic()) is None)  # its cool-down is over
        status, _, _ = await infer(http, srv.url, {"input": "probe-fails"})  # half-open probe: still broken
        assert status == 500
        assert (await infer(http, srv.url, {"input": "refused-again"}))[0] == 503
        fakes.failing.clear()
        await until(lambda: breaker.refusal_s(time.monotonic()) is None)
        status, body, _ = await infer(http, srv.url, {"input": "probe-ok"})
        assert status == 200 and body["output"] == expected_output("probe-ok")
        assert srv.models["m"].breaker.state.value == "closed"
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200
        refusals = {reason: n for (_, _, reason), n in srv.models["m"].metrics.refused.items()}
        assert refusals == {"breaker_open": 2}  # one per 503 answered


async def test_a_dead_worker_is_replaced_and_its_batch_runs_again(http):
    model = switchable(latency_ms=20, max_batch_size=8, max_wait_ms=10)
    async with running_server(model) as srv:
        inputs = ["DIE-now"] + [f"d{i}" for i in range(5)]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t}) for t in inputs))
        for text, (status, body, _) in zip(inputs, results):
            assert status == 200, body
            assert body["output"] == expected_output(text)
        assert srv.models["m"].pool.replacements == 1
        assert srv.models["m"].pool.healthy == 1


async def test_a_replacement_dying_as_the_worker_before_it_fails_what_it_held_at_once_and_backs_off(http):
    model = switchable(latency_ms=10, max_batch_size=8, max_wait_ms=0)
    async with running_server(model) as srv:
        served = srv.models["m"]
        fakes.dying.set()  # every worker that takes this batch dies
        started = time.monotonic()
        status, body, headers = await infer(http, srv.url, {"input": "DIE-always", "timeout_ms": 20000})
        assert (status, body["error"]) == (503, "MODEL_UNAVAILABLE") and "worker died" in body["message"]
        assert body["retry_after_ms"] == 1000 and "Retry-After" in headers
        assert time.monotonic() - started < 10  # failed at once, not at its deadline
        assert (served.pool.deaths, served.pool.repeated_deaths) == (2, 1)  # the first ran again; its replacement died too
        fakes.dying.clear()
        await until(lambda: served.pool.healthy == 1)  # the next replacement, a second later
        status, body, _ = await infer(http, srv.url, {"input": "after"})
        assert status == 200 and body["output"] == expected_output("after")
        assert served.pool.replacements == 2
        async with http.get(f"{srv.url}/v1/models/m") as resp:
            described = await resp.json()
        assert (described["worker_deaths"], described["worker_repeated_deaths"]) == (2, 1)


async def test_a_replacement_that_fails_to_start_is_tried_again_until_one_starts(http):
    model = switchable(latency_ms=20, max_batch_size=8, max_wait_ms=10)
    async with running_server(model) as srv:
        served = srv.models["m"]
        fakes.build_failing.set()
        # The only worker dies on this batch; the request waits in the queue while replacements fail.
        waiting = asyncio.ensure_future(infer(http, srv.url, {"input": "DIE-now", "timeout_ms": 20000}))
        await until(lambda: served.pool.build_failures >= 2)  # the first try, and the retry a second later
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503  # no worker: balancers send the traffic elsewhere meanwhile
        assert not waiting.done()
        fakes.build_failing.clear()  # the device recovers: the next retry (2 s later) starts
        status, body, _ = await asyncio.wait_for(waiting, 10)
        assert status == 200 and body["output"] == expected_output("DIE-now")
        assert served.pool.healthy == 1
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200


async def test_retries_are_bounded(http):
    model = sim_model(backend="inferd.backends.faulty:create", latency_ms=20, workers=2, max_batch_size=1,
                      max_wait_ms=0, batch_timeout_ms=200, max_batch_attempts=2,
                      options={"hang_marker": "STUCK", "hang_s": 30})
    async with running_server(model) as srv:
        started = time.monotonic()
        stuck, fine = await asyncio.gather(infer(http, srv.url, {"input": "STUCK"}), infer(http, srv.url, {"input": "fine"}))
        assert fine[0] == 200
        assert (stuck[0], stuck[1]["error"]) == (500, "INFERENCE_FAILED")
        assert "2 attempts" in stuck[1]["message"]
        assert time.monotonic() - started < 3
        assert srv.models["m"].pool.replacements == 2
