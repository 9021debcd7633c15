"""A backend called in two steps (`launch`, `collect`), served by the real server: the next full batch is
launched while one computes, one batch computes at a time, each request gets its own output, and a batch
whose launch fails fails alone. The stand-in is the simulated GPU with host-side work per batch."""

from __future__ import annotations

import asyncio

from inferd.backends.sim import PipelinedGPU, expected_output

from ..helpers import backend_of, infer, running_server, sim_model


def pipelined(**kw):  # type: ignore[no-untyped-def]
    return sim_model(latency_ms=30, max_batch_size=8, max_wait_ms=5, timeout_ms=30_000, max_queue=10_000,
                     options={"pipelined": True, "prepare_ms": 30, **kw})


async def test_the_next_full_batch_is_launched_while_one_computes_and_each_request_gets_its_own(http):
    async with running_server(pipelined()) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": f"item {i}"}) for i in range(160)))
        gpu = backend_of(srv, "m")
    assert isinstance(gpu, PipelinedGPU)
    assert [(status, body["output"]) for status, body, _ in results] == [(200, expected_output(f"item {i}")) for i in range(160)]
    spans = sorted((start, end) for start, end, _ in gpu.calls)
    assert all(end <= following + 1e-6 for (_, end), (following, _) in zip(spans, spans[1:], strict=False))  # one at a time
    # overlap: some batch's host-side launch began before the batch ahead of it had left the device
    assert any(began < spans[i][1] for i, (began, _) in enumerate(gpu.launches[1:]) if i < len(spans))


async def test_a_batch_whose_launch_fails_fails_alone(http):
    async with running_server(pipelined()) as srv:
        inputs = [f"item {i}" if i != 37 else "POISON_LAUNCH" for i in range(80)]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": text}) for text in inputs))
    for text, (status, body, _) in zip(inputs, results, strict=True):
        if text == "POISON_LAUNCH":
            assert status == 500 and body["error"] == "INFERENCE_FAILED"
        else:
            assert status == 200 and body["output"] == expected_output(text)
