"""inferd's OTLP/JSON encoding of finished spans: the same message as the SDK's protobuf encoder for the
same spans (read back through OTLP's own protobuf schema), and an export a collector on loopback takes."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.config import TracingConfig
from inferd.messages import Batch, PendingRequest
from inferd.observability.otlp_json import OtlpJsonExporter, encode_spans
from inferd.observability.tracing import Tracing

CLIENT = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


async def finished_spans() -> list:
    """What a server writes for two traced requests (one continuing a client's trace, one failing with a
    500) that shared a batch: server spans, admission/queue/compute children, the batch span, links."""
    kept = InMemorySpanExporter()
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=1.0), kept)
    loop, now = asyncio.get_running_loop(), time.monotonic()
    traces, requests = [], []
    for i, headers in enumerate((CLIENT, {})):
        trace = tracing.begin(headers, now, "/v1/inference")
        request = PendingRequest(f"r{i}", "x", now + 0.001, now + 5, loop.create_future(), due=now + 5, tier="paid",
                                 tenant="acme", raw="x")
        trace.admitted([request], "m", "2", "paid", "acme")
        traces.append(trace)
        requests.append(request)
    batch = Batch(7, requests, "full", now + 0.002)
    batch.started_at, batch.finished_at, batch.worker = now + 0.003, now + 0.013, "cpu-0"
    tracing.batch(batch, "m")
    for request in requests:
        request.batch = batch
    tracing.end(traces[0], "r0", 200)
    tracing.end(traces[1], "r1", 500)
    return list(kept.get_finished_spans())


def _as_proto_json(body: bytes) -> dict:
    """OTLP's JSON form read as protobuf's standard JSON mapping reads bytes: hex ids become base64."""
    def ids(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") else ids(v)
                    for k, v in node.items()}
        return [ids(v) for v in node] if isinstance(node, list) else node
    return ids(orjson.loads(body))


async def test_the_json_is_the_sdks_protobuf_message_field_for_field():
    spans = await finished_spans()
    assert len(spans) == 9 and {s.name for s in spans} == {"POST /v1/inference", "admission", "queue", "compute", "batch"}
    ours = json_format.ParseDict(_as_proto_json(encode_spans(spans)), ExportTraceServiceRequest())
    assert ours == sdk_encode_spans(spans)
    server = next(s for s in ours.resource_spans[0].scope_spans[0].spans if s.name == "POST /v1/inference"
                  and s.parent_span_id)  # the client's trace, continued: its span is our parent
    assert server.parent_span_id.hex() == "00f067aa0ba902b7" and server.flags == 0x300 and server.kind == 2


def test_an_export_reaches_a_collector_and_a_refusal_is_not_retried():
    received: list[tuple[str, bytes]] = []
    status = [200]

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the handler's name)
            received.append((self.headers["Content-Type"], self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    spans = asyncio.run(finished_spans())
    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        exporter = OtlpJsonExporter(f"http://127.0.0.1:{collector.server_port}/v1/traces", timeout_s=2.0)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert received[0][0] == "application/json" and received[0][1] == encode_spans(spans)
        status[0] = 400  # a body the collector will never take: dropped at once
        assert exporter.export(spans) is SpanExportResult.FAILURE and len(received) == 2
        status[0] = 503  # a collector busy for longer than the timeout: tried again, then dropped
        started = time.monotonic()
        assert OtlpJsonExporter(exporter.endpoint, timeout_s=0.5).export(spans) is SpanExportResult.FAILURE
        assert len(received) > 3 and time.monotonic() - started < 1.5
    finally:
        collector.shutdown()
        collector.server_close()
