"""OpenTelemetry traces across the batch, read from the SDK's in-memory exporter: the span tree of a
request, the batch span linked to its requests, a client's traceparent continued, nothing secret."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.config import AuthConfig, TenantConfig, TracingConfig

from ..helpers import infer, running_server, sim_model, until

KEY = "secret-key-of-acme"
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier="default"),
            tenants=(TenantConfig("acme", "default", hashlib.sha256(KEY.encode()).hexdigest()),))


def tracing(rate: float) -> TracingConfig:
    return TracingConfig(enabled=True, sample_rate=rate)


async def test_a_batch_is_a_span_linked_to_the_requests_it_carries_and_each_request_has_its_stages(http, caplog):
    spans = InMemorySpanExporter()
    texts = [f"private input {i}" for i in range(4)]
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        async with running_server(sim_model(latency_ms=50, max_batch_size=8, max_wait_ms=30), tracing=tracing(1.0),
                                  span_exporter=spans, access_log_sample_rate=0.0, **AUTH) as srv:
            headers = {"Authorization": f"Bearer {KEY}"}
            results = await asyncio.gather(*(infer(http, srv.url, {"input": t}, headers=headers) for t in texts))
            assert [status for status, _, _ in results] == [200] * 4
            await until(lambda: sum(s.name.startswith("POST") for s in spans.get_finished_spans()) == 4)
    finished = spans.get_finished_spans()
    requests = [s for s in finished if s.name == "POST /v1/inference"]
    (batch,) = [s for s in finished if s.name == "batch"]
    assert batch.attributes["inferd.batch_size"] == 4 and batch.attributes["inferd.model"] == "m"
    assert {link.context.span_id for link in batch.links} == {r.context.span_id for r in requests}
    assert batch.parent is None and batch.context.trace_id not in {r.context.trace_id for r in requests}
    for request in requests:
        children = {s.name: s for s in finished if s.parent is not None and s.parent.span_id == request.context.span_id}
        assert set(children) == {"admission", "queue", "compute"}
        assert request.start_time <= children["admission"].start_time <= children["queue"].start_time
        assert children["queue"].end_time <= children["compute"].start_time <= children["compute"].end_time <= request.end_time
        assert [link.context.span_id for link in children["compute"].links] == [batch.context.span_id]
        assert request.attributes["inferd.tenant"] == "acme" and request.attributes["http.response.status_code"] == 200
    everything = json.dumps([dict(s.attributes) for s in finished])
    assert KEY not in everything and "private input" not in everything  # never a key or an input
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    assert {line["trace_id"] for line in logged} == {format(r.context.trace_id, "032x") for r in requests}


async def test_a_clients_traceparent_is_continued_and_its_decision_kept(http):
    spans = InMemorySpanExporter()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with running_server(sim_model(latency_ms=5), tracing=tracing(0.0), span_exporter=spans) as srv:
        await infer(http, srv.url, {"input": "a"})  # no traceparent, rate 0: not traced
        await infer(http, srv.url, {"input": "b"}, headers={"traceparent": f"00-{trace_id}-{parent_id}-00"})  # not sampled
        status, _, _ = await infer(http, srv.url, {"input": "c"}, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
        assert status == 200
        await until(lambda: any(s.name.startswith("POST") for s in spans.get_finished_spans()))
    (request,) = [s for s in spans.get_finished_spans() if s.name.startswith("POST")]
    assert format(request.context.trace_id, "032x") == trace_id and format(request.parent.span_id, "016x") == parent_id
    assert request.parent.is_remote


async def test_without_a_tracing_table_nothing_is_traced(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        status, _, _ = await infer(http, srv.url, {"input": "a"}, headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})
        assert status == 200 and srv.tracing is None and srv.models["m"].tracing is None


async def test_a_refused_call_is_traced_with_its_status(http):
    # The fast path draws a call's trace once it knows the call is a batch model's, or refused: a refusal
    # (an unknown model, found only in the body) keeps its span, as the handler's refusals do.
    spans = InMemorySpanExporter()
    parent = f"00-{'3' * 32}-{'4' * 16}-01"
    async with running_server(sim_model(latency_ms=5), tracing=tracing(0.0), span_exporter=spans) as srv:
        status, _, _ = await infer(http, srv.url, {"model": "nope", "input": "a"}, headers={"traceparent": parent})
        assert status == 404
        await until(lambda: any(s.name.startswith("POST") for s in spans.get_finished_spans()))
    (request,) = [s for s in spans.get_finished_spans() if s.name.startswith("POST")]
    assert request.attributes["http.response.status_code"] == 404 and format(request.context.trace_id, "032x") == "3" * 32
