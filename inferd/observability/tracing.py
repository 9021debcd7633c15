"""OpenTelemetry traces across the batch (opt-in: a `[tracing]` table; OpenTelemetry is imported only then).

A request is sampled once, at its start, by inferd itself: a W3C `traceparent` from the client keeps its
own decision (its trace continues here), a request without one is sampled at `sample_rate`. An
unsampled request costs a header look-up and a random draw, and no span object at all. A sampled
request gets a span that lasts from its arrival to its answer, and at the end its stages as children,
from the times the request path records anyway: admission, queue wait, compute. A batch holding a
sampled request is a span of its own, linked to the spans of the requests it carries (one batch, many
parents, as OpenTelemetry advises for batching), and each request's compute span links back to it.

Attributes name the model, batch (id, size, bucket, trigger, worker), tier and tenant; never a key or an
input. Spans leave through a batching processor on its own thread, to OTLP over HTTP, stdout or a file.
"""

from __future__ import annotations

import random
import re
import time
from typing import TYPE_CHECKING, Any

from ..config import TracingConfig

if TYPE_CHECKING:
    from ..messages import Batch, PendingRequest

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class RequestTrace:
    """The span of one sampled request, open until its answer, and what the handler learns for it."""

    __slots__ = ("span", "trace_id", "requests", "model", "tier", "tenant")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.trace_id = format(span.get_span_context().trace_id, "032x")
        self.requests: list[PendingRequest] = []  # its admitted inputs
        self.model = self.tier = self.tenant = "-"

    def admitted(self, requests: list[PendingRequest], model: str, tier: str, tenant: str) -> None:
        for request in requests:
            request.trace = self
        self.requests, self.model, self.tier, self.tenant = requests, model, tier, tenant


class Tracing:
    """The tracer, and the rules above. `exporter`: spans go there instead (tests use an in-memory one)."""

    def __init__(self, config: TracingConfig, exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self._api = trace
        self.sample_rate = config.sample_rate
        self.provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
        if exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            self.provider.add_span_processor(BatchSpanProcessor(_exporter(config)))
        self.tracer = self.provider.get_tracer("inferd")
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic times as the wall-clock ns spans take
        self._random = random.random
        self._root = Context()  # a batch's span starts a trace of its own

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._epoch_offset_ns

    def begin(self, headers: Any, started: float, route: str) -> RequestTrace | None:
        """The request's span when it is sampled, else None (nothing else is made)."""
        parent = None
        header = headers.get("traceparent")
        match = _TRACEPARENT.fullmatch(header.strip().lower()) if header else None
        if match is not None and int(match[1], 16) and int(match[2], 16):
            if not int(match[3], 16) & 1:
                return None  # the caller did not sample this trace: neither do we
            trace = self._api
            parent = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
                int(match[1], 16), int(match[2], 16), is_remote=True, trace_flags=trace.TraceFlags(1))))
        elif self._random() >= self.sample_rate:
            return None
        span = self.tracer.start_span(f"POST {route}", context=parent, kind=self._api.SpanKind.SERVER,
                                      start_time=self._ns(started), attributes={"http.route": route})
        return RequestTrace(span)

    def end(self, trace: RequestTrace, request_id: str, status: int) -> None:
        """Close a sampled request's span, with its stages as children (from the times already recorded)."""
        span, now, requests = trace.span, time.monotonic(), trace.requests
        span.set_attributes({"inferd.request_id": request_id, "inferd.model": trace.model, "inferd.tier": trace.tier,
                             "inferd.tenant": trace.tenant, "http.response.status_code": status})
        if requests:
            context = self._api.set_span_in_context(span)
            start = self._ns(min(r.enqueued_at for r in requests))
            self._child("admission", context, span.start_time, start)
            batches = {id(r.batch): r.batch for r in requests if r.batch is not None}
            if batches:
                self._child("queue", context, start, self._ns(min(b.started_at for b in batches.values())))
            for batch in batches.values():
                links = [self._api.Link(batch.span.get_span_context())] if batch.span is not None else []
                self._child("compute", context, self._ns(batch.started_at), self._ns(batch.finished_at), links,
                            {"inferd.batch_id": batch.batch_id, "inferd.batch_size": batch.size})
            shared = {r.state.value for r in requests if r.batch is None or r.lead is not None}
            if shared:
                span.set_attribute("inferd.shared", sorted(shared))
        span.end(end_time=self._ns(now))

    def _child(self, name: str, context: Any, start_ns: int, end_ns: int, links: list | None = None,
               attributes: dict | None = None) -> None:
        child = self.tracer.start_span(name, context=context, start_time=start_ns, links=links, attributes=attributes)
        child.end(end_time=max(start_ns, end_ns))

    def batch(self, batch: Batch, model: str) -> None:
        """A finished batch that carries a sampled request: its own span, linked to each of theirs."""
        links = [self._api.Link(r.trace.span.get_span_context()) for r in batch.requests if r.trace is not None]
        links += [self._api.Link(rider.trace.span.get_span_context()) for r in batch.requests for rider in r.riders or ()
                  if rider.trace is not None]
        if not links:
            return
        first = batch.requests[0]
        span = self.tracer.start_span("batch", context=self._root,
                                      start_time=self._ns(batch.started_at), links=links, attributes={
                                          "inferd.model": model, "inferd.batch_id": batch.batch_id,
                                          "inferd.batch_size": batch.size, "inferd.bucket": first.bucket,
                                          "inferd.trigger": batch.trigger, "inferd.worker": batch.worker,
                                          "inferd.error": batch.error is not None})
        span.end(end_time=self._ns(batch.finished_at))
        batch.span = span

    def shutdown(self) -> None:
        self.provider.shutdown()  # (sends what is still queued)


def _exporter(config: TracingConfig) -> Any:
    if config.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=config.endpoint)
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if config.exporter == "console":
        return ConsoleSpanExporter()
    return ConsoleSpanExporter(out=open(config.path, "a", encoding="utf-8"),  # noqa: SIM115 (for the process's life)
                               formatter=lambda span: span.to_json(indent=None) + "\n")
