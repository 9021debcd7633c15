"""Tracing's own rules, without a server: who decides what is sampled, and how long shutdown may take."""

from __future__ import annotations

import socket
import time

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.config import TracingConfig
from inferd.observability.tracing import ClientDecisions, Generated, Tracing

SAMPLED = {"traceparent": f"00-{'4bf92f3577b34da6a3ce929d0e0e4736'}-{'00f067aa0ba902b7'}-01"}


def test_a_client_cannot_force_every_request_to_be_traced():
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=0.0, max_client_traced_per_s=5), InMemorySpanExporter())
    now = time.monotonic()
    traced = [tracing.begin(SAMPLED, now, "/v1/inference") for _ in range(100)]
    assert sum(t is not None for t in traced) == 5  # a second's worth at once
    later = [tracing.begin(SAMPLED, now + 1.0, "/v1/inference") for _ in range(100)]
    assert sum(t is not None for t in later) == 5  # then `max_client_traced_per_s` a second
    assert all(t.parent is not None and t.parent.is_remote for t in traced + later if t is not None)  # continued


def test_past_the_ceiling_a_clients_request_is_drawn_like_any_other():
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=1.0, max_client_traced_per_s=0), InMemorySpanExporter())
    trace = tracing.begin(SAMPLED, time.monotonic(), "/v1/inference")
    assert trace is not None and format(trace.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_the_bucket_refills_at_its_rate_and_holds_a_second_of_it():
    bucket = ClientDecisions(2.0)
    assert [bucket.take(100.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(100.5) and not bucket.take(100.5)
    assert [bucket.take(110.0) for _ in range(3)] == [True, True, False]  # idle time does not pile up
    assert not ClientDecisions(0.0).take(1.0)


def test_shutdown_with_the_collector_down_takes_the_flush_timeout_at_most():
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = TracingConfig(enabled=True, sample_rate=1.0, exporter="otlp", flush_timeout_s=0.5,
                           endpoint=f"http://127.0.0.1:{port}/v1/traces")
    tracing = Tracing(config)
    for _ in range(10):
        trace = tracing.begin({}, time.monotonic(), "/v1/inference")
        assert trace is not None
        tracing.end(trace, "r", 200)
    started = time.monotonic()
    tracing.shutdown()
    assert time.monotonic() - started < 1.5


def test_a_generation_that_never_got_a_token_has_only_the_stages_it_reached():
    spans = InMemorySpanExporter()
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=1.0), spans)
    now = time.monotonic()
    trace = tracing.begin({}, now, "/v1/completions")
    assert trace is not None
    trace.generation = Generated("tiny-7", admitted_at=now + 0.001, tokenized_at=now + 0.002, prompt_tokens=5)
    tracing.end(trace, "r", 504)
    root = next(s for s in spans.get_finished_spans() if s.name == "POST /v1/completions")
    children = [s.name for s in spans.get_finished_spans() if s.parent is not None]
    assert children == ["admission", "tokenize"]  # no prefill or decode: the deadline passed before a token
    assert root.attributes["inferd.engine_request_id"] == "tiny-7" and root.attributes["gen_ai.usage.output_tokens"] == 0
    assert "gen_ai.response.finish_reasons" not in root.attributes and root.status.is_ok is False
