"""Latency objectives against the real server: a request that would not meet its objective is refused at
once (503 in a millisecond, never a 504 later), the admitted ones meet it; the cost model shows what a
batch of each size costs; the prediction and its error are visible."""

from __future__ import annotations

import asyncio

import aiohttp

from .. import helpers
from ..helpers import infer, running_server, sim_model


def metric(text: str, line_start: str) -> float:
    """A sample's value in a /metrics page (0 where it is not there yet)."""
    return next((float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(line_start)), 0.0)


async def taught(http, url: str, body: dict, n: int) -> None:  # type: ignore[no-untyped-def]
    """A first burst, not judged: the cost model and the admission margin learn this host's batch times and
    lateness from it (on a host whose cores are busy with other work a batch of the simulated GPU's 50 ms
    came in 60-70, and a fresh server's first burst, predicted from 50, ran past its objective)."""
    await asyncio.gather(*(infer(http, url, {**body, "input": f"{body['input']} warm {i}"}) for i in range(n)))
    await asyncio.sleep(0.5)  # (its admitted ones answered, its refused ones gone)


def timing(headers) -> dict[str, float]:  # type: ignore[no-untyped-def]
    parts = (p.partition(";dur=") for p in headers.get("Server-Timing", "").split(","))
    return {name.strip(): float(value) for name, _, value in parts if value}


async def test_a_burst_past_the_objective_is_refused_at_once_and_what_is_admitted_meets_it(http):
    model = sim_model(latency_ms=50, max_batch_size=8, slo_ms=300, timeout_ms=5000, max_queue=1000)
    met = 'inferd_objective_requests_total{model="m",result="met",tier="default",version="1"} '
    async with running_server(model) as srv:
        await taught(http, srv.url, {"input": "first"}, 120)
        async with http.get(f"{srv.url}/metrics") as resp:
            met_before = metric(await resp.text(), met)
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"burst {i}"}) for i in range(120)))
        async with http.get(f"{srv.url}/metrics") as resp:
            metrics = await resp.text()
    served = [(body, headers) for status, body, headers in results if status == 200]
    refused = [(body, headers) for status, body, headers in results if status == 503]
    assert len(served) + len(refused) == 120 and served and refused  # nothing else: no 504
    # 50 ms a batch of 8, 300 ms to answer: at most ~5 batches' worth was taken in
    assert 8 <= len(served) <= 48, len(served)
    assert all(body["latency_ms"] <= 300 for body, _ in served), sorted(body["latency_ms"] for body, _ in served)[-5:]
    assert {body["error"] for body, _ in refused} == {"SERVICE_OVERLOADED"}
    assert all("latency objective" in body["message"] and body["retry_after_ms"] > 0 for body, _ in refused)
    assert max(timing(headers)["total"] for _, headers in refused) < 50  # refused at once, not queued first
    for _, headers in refused:  # what was compared: the predicted answer with its margin, past the budget
        figures = timing(headers)
        assert figures["predicted"] + figures["margin"] > figures["budget"] > 0, figures
    assert 'inferd_admission_margin_ratio{model="m",version="1"}' in metrics
    assert all("predicted_queue" in timing(headers) for _, headers in served)
    assert 'inferd_refused_total{model="m",reason="slo_infeasible",tier="default"}' in metrics
    assert metric(metrics, met) == met_before + len(served)
    assert 'inferd_wait_prediction_error_seconds_bucket{le="+Inf",model="m",tier="default",version="1"}' in metrics


async def test_the_cost_curve_of_a_variable_cost_model_is_learned_and_shown(http):
    # 10 ms + 2 ms a request: what the sim's variable cost makes of one input and of eight. The linger is
    # long (a batch of eight leaves when full, at once), so that on a busy host the eight still meet.
    model = sim_model(latency_ms=10, max_batch_size=8, max_wait_ms=250, options={"per_item_ms": 2.0})
    async with running_server(model) as srv:
        for size in (1, 8, 8, 1, 8):
            await asyncio.gather(*(infer(http, srv.url, {"input": f"{size} {i} {id(srv)}"}) for i in range(size)))
        async with http.get(f"{srv.url}/v1/models/m") as resp:
            costs = (await resp.json())["cost_model"]
        async with http.get(f"{srv.url}/metrics") as resp:
            metrics = await resp.text()
    sizes = costs["buckets"]["0"]["sizes"]
    assert sizes["1"]["ms"] < sizes["8"]["ms"], sizes  # a fuller batch costs more...
    assert 20 <= sizes["8"]["ms"] <= 45 and sizes["8"]["runs"] >= 2  # ...about 26 ms for 8
    assert costs["buckets"]["0"]["size_limit"] == 8 and costs["slack"] >= 0.1
    assert 'inferd_batch_cost_seconds{bucket="0",model="m",size="8",version="1"}' in metrics


async def test_answered_requests_are_freed_by_reference_counting_alone(http):
    """No request, batch or future is left in a reference cycle (the cyclic collector, which pauses the
    process, would be the only one to free them): answers, refusals, deadlines and shared work."""
    import gc

    # "m" refuses what it predicts late (503); "d" queues it all the same, so that deadlines pass (504)
    # whatever the machine's load makes of the predictions
    models = [sim_model(name, latency_ms=20, max_batch_size=8, max_wait_ms=1, max_queue=30, refuse_early=name == "m")
              for name in ("m", "d")]
    async with running_server(*models) as srv:
        await asyncio.gather(*(infer(http, srv.url, {"model": name, "input": f"warm {i}"}) for i in range(20) for name in "md"))
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            results = await asyncio.gather(*(
                infer(http, srv.url, {"model": name, "input": f"x{i % 40}", "timeout_ms": 60 if i % 3 else 5000})
                for i in range(200) for name in "md"))
            await helpers.until(lambda: all(srv.models[name].batcher.depth == 0 and not srv.models[name].pool.running()
                                            for name in "md"))
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage if type(o).__name__ in ("PendingRequest", "Batch", "Future")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert {status for status, _, _ in results[0::2]} & {503, 504} and {status for status, _, _ in results[1::2]} >= {200, 504}
    assert left == [], f"{len(left)} objects freed only by the cyclic collector: {sorted(set(left))}"


async def test_an_objective_per_tier_holds_the_tighter_of_the_two(http):
    from inferd.config import AuthConfig, TierConfig

    model = sim_model(latency_ms=50, max_batch_size=4, slo_ms=1000, timeout_ms=5000)
    tiers = (TierConfig("paid", priority=1), TierConfig("free", priority=0, slo_ms=120))
    async with running_server(model, auth=AuthConfig(enabled=True, anonymous_tier="free"), tiers=tiers) as srv:
        await taught(http, srv.url, {"input": "first"}, 40)
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"free {i}"}) for i in range(40)))
    statuses = [status for status, _, _ in results]
    assert statuses.count(200) <= 8 and statuses.count(503) >= 32  # 120 ms holds: two batches of 4 at most
    latencies = sorted(body["latency_ms"] for status, body, _ in results if status == 200)
    assert all(ms <= 120 for ms in latencies), latencies


async def test_without_an_objective_only_the_deadline_refuses(http: aiohttp.ClientSession):
    model = sim_model(latency_ms=50, max_batch_size=4, timeout_ms=5000)
    async with running_server(model) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"q {i}", "timeout_ms": 280}) for i in range(40)))
    statuses = [status for status, _, _ in results]
    assert statuses.count(504) == 0 and 8 <= statuses.count(200) <= 24  # 280 ms: about 5 batches of 4
    assert {body["error"] for status, body, _ in results if status == 503} == {"SERVICE_OVERLOADED"}
    assert all("deadline" in body["message"] for status, body, _ in results if status == 503)


async def test_a_request_with_a_tighter_deadline_than_its_own_earlier_ones_goes_by_its_deadline(http):
    """One client's request with a 300 ms deadline behind its own earlier request lingering for a batch
    under a 1 s objective: its batch goes by its deadline, with the earlier one in it. Before, only the
    head of each client's queue set the bucket's due: it waited out the linger and expired (504)."""
    model = sim_model(latency_ms=20, max_batch_size=8, slo_ms=1000, timeout_ms=5000)
    async with running_server(model) as srv:
        for round_ in range(2):  # (requests arriving: the rule lingers for more)
            await asyncio.gather(*(infer(http, srv.url, {"input": f"warm {round_} {i}"}) for i in range(8)))
        lax = asyncio.ensure_future(infer(http, srv.url, {"input": "lax"}))
        await helpers.until(lambda: srv.models["m"].batcher.depth == 1)
        status, body, _ = await infer(http, srv.url, {"input": "tight", "timeout_ms": 300})
        lax_status, lax_body, _ = await lax
    assert status == 200 and body["latency_ms"] <= 300, body
    assert lax_status == 200 and lax_body["output"] and lax_body["latency_ms"] < 600, lax_body
