"""What an answered request leaves behind: nothing that only the cyclic collector could free. A request,
its batch, its inputs (here ~50 KB each) and a refusal's exception are let go by reference counting
alone, whatever `gc_threshold` says (issue 31: with the collector rarely run, RSS grew by gigabytes)."""

from __future__ import annotations

import asyncio
import gc

from inferd.messages import Batch, PendingRequest

from ..helpers import infer, running_server, sim_model, until


def alive() -> dict[str, int]:
    """inferd's per-request objects still in memory (with the collector off, only cycles keep them)."""
    kinds = {"requests": 0, "batches": 0, "big inputs": 0}
    for obj in gc.get_objects():
        if isinstance(obj, PendingRequest):
            kinds["requests"] += 1
            kinds["big inputs"] += isinstance(obj.input, str) and len(obj.input) > 40_000
        elif isinstance(obj, Batch):
            kinds["batches"] += 1
    return kinds


async def test_answered_and_refused_requests_are_freed_without_the_cyclic_collector(http):
    async with running_server(sim_model(latency_ms=5, max_batch_size=8, max_queue=1000)) as srv:
        await infer(http, srv.url, {"input": "warm"})
        gc.collect()
        gc.disable()
        try:
            answered = [infer(http, srv.url, {"input": f"{i}:" + "x" * 50_000}) for i in range(60)]
            refused = [infer(http, srv.url, {"input": f"late {i}", "timeout_ms": 1}) for i in range(20)]  # 503s
            results = await asyncio.gather(*answered, *refused)
            assert [s for s, _, _ in results[:60]] == [200] * 60 and {s for s, _, _ in results[60:]} <= {503, 504}
            await until(lambda: srv.lifecycle.in_flight == 0)  # (the last answers' handlers returned)
            # The worker thread's frame still names the batch it ran last (not a cycle, and not visible to
            # the collector): one small request moves it on.
            assert (await infer(http, srv.url, {"input": "the last one"}))[0] == 200
            left = alive()
        finally:
            gc.enable()
    assert left["big inputs"] == 0 and left["requests"] <= 1 and left["batches"] <= 1, left
