"""OpenTelemetry traces across the batch (opt-in: a `[tracing]` table; OpenTelemetry is imported only then).

A request is sampled once, at its start, by inferd itself: a W3C `traceparent` from the client keeps its
own decision (its trace continues here) up to `max_client_traced_per_s` (past it, and for a request
without one, the decision is a draw at `sample_rate`: a client cannot make every request cost a trace). An
unsampled request costs a header look-up and a random draw, and no span object at all. A sampled
request gets a span from its arrival to its answer, with its stages as children, written when it is
answered from the times the request path records anyway: admission, queue wait, compute. A batch holding a
sampled request is a span of its own, linked to the spans of the requests it carries (one batch, many
parents, as OpenTelemetry advises for batching), and each request's compute span links back to it. A
generation request's children are its admission, tokenising, prefill (to the first token) and decode,
named with the engine's request id.

Attributes name the model, batch (id, size, bucket, trigger, worker), tier and tenant; never a key or an
input. Spans leave through a batching processor on its own thread, to OTLP over HTTP, stderr or a file
(one JSON line per span); OTLP is JSON encoded by inferd (`otlp_json`: the SDK's encoder costs 7x a span),
the SDK's protobuf on request; at shutdown the last ones get `flush_timeout_s`, never longer (a collector
that is down cannot hold the process).
"""

from __future__ import annotations

import logging
import random
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import TracingConfig

if TYPE_CHECKING:
    from ..messages import Batch, PendingRequest

log = logging.getLogger("inferd.tracing")
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class RequestTrace:
    """One sampled request: its span's identity (known from its start, so a batch can link to it), and
    what the handler learns for it."""

    __slots__ = ("context", "parent", "started", "route", "requests", "model", "version", "tier", "tenant", "generation")

    def __init__(self, context: Any, parent: Any, started: float, route: str) -> None:
        self.context, self.parent, self.started, self.route = context, parent, started, route
        self.requests: list[PendingRequest] = []  # its admitted inputs
        self.model = self.version = self.tier = self.tenant = "-"
        self.generation: Generated | None = None  # a generation model's request: its stages

    @property
    def trace_id(self) -> str:
        return format(self.context.trace_id, "032x")

    def admitted(self, requests: list[PendingRequest], model: str, version: str, tier: str, tenant: str) -> None:
        for request in requests:
            request.trace = self
        self.requests, self.model, self.version, self.tier, self.tenant = requests, model, version, tier, tenant


@dataclass(slots=True)
class Generated:
    """What a generation request's trace shows: the engine's request id, and when each stage ended
    (admitted, prompt tokenised, first token, last token; 0.0: it never got there)."""

    engine_request_id: str
    admitted_at: float
    tokenized_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


class Tracing:
    """The rules above, and where finished spans go. `exporter`: there instead (tests: in memory).

    Spans are written finished (`ReadableSpan`s handed to the processor), not started and ended
    through a tracer: every time is known when a request is answered, and skipping the tracer's
    sampler, id generator and live-span bookkeeping makes a traced request cost about half as much."""

    def __init__(self, config: TracingConfig, exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace.status import Status, StatusCode

        self._api, self._readable = trace, ReadableSpan
        self._error, self._unset = Status(StatusCode.ERROR), Status(StatusCode.UNSET)
        self.sample_rate = config.sample_rate
        self.client_decisions = ClientDecisions(config.max_client_traced_per_s)
        self.flush_timeout_s = config.flush_timeout_s
        self._resource = Resource.create({"service.name": config.service_name})
        self._scope = InstrumentationScope("inferd")
        self._sampled = trace.TraceFlags(trace.TraceFlags.SAMPLED)
        self._processor = SimpleSpanProcessor(exporter) if exporter is not None else BatchSpanProcessor(_exporter(config))
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic times as the wall-clock ns spans take
        self._random, self._bits = random.random, random.getrandbits

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._epoch_offset_ns

    def _context(self, trace_id: int | None = None) -> Any:
        return self._api.SpanContext(trace_id or self._bits(128) or 1, self._bits(64) or 1, is_remote=False,
                                     trace_flags=self._sampled)

    def begin(self, headers: Any, started: float, route: Any) -> RequestTrace | None:
        """The request's trace when it is sampled, else None (nothing else is made). `route`: a string, or
        the request, whose path is read only when it is sampled (aiohttp decodes a path when asked)."""
        header = headers.get("traceparent")
        match = _TRACEPARENT.fullmatch(header.strip().lower()) if header else None
        if match is not None and int(match[1], 16) and int(match[2], 16):
            if not int(match[3], 16) & 1:
                return None  # the caller did not sample this trace: neither do we
            if not self.client_decisions.take(started) and self._random() >= self.sample_rate:
                return None  # past the ceiling, the client's decision is ours to draw
            parent = self._api.SpanContext(int(match[1], 16), int(match[2], 16), is_remote=True, trace_flags=self._sampled)
            return RequestTrace(self._context(parent.trace_id), parent, started, _route(route))
        if self._random() >= self.sample_rate:
            return None
        return RequestTrace(self._context(), None, started, _route(route))

    def end(self, trace: RequestTrace, request_id: str, status: int) -> None:
        """Write a sampled request's span, with its stages as children (from the times already recorded)."""
        now, requests, context = time.monotonic(), trace.requests, trace.context
        attributes: dict[str, Any] = {
            "http.route": trace.route, "inferd.request_id": request_id, "inferd.model": trace.model,
            "inferd.model_version": trace.version, "inferd.tier": trace.tier, "inferd.tenant": trace.tenant,
            "http.response.status_code": status}
        if requests:
            start = self._ns(min(r.enqueued_at for r in requests))
            self._write("admission", context, self._ns(trace.started), start)
            batches = {id(r.batch): r.batch for r in requests if r.batch is not None}
            if batches:
                self._write("queue", context, start, self._ns(min(b.started_at for b in batches.values())))
            for batch in batches.values():
                self._write("compute", context, self._ns(batch.started_at), self._ns(batch.finished_at),
                            {"inferd.batch_id": batch.batch_id, "inferd.batch_size": batch.size},
                            [self._api.Link(batch.span)] if batch.span is not None else ())
            shared = {r.state.value for r in requests if r.batch is None or r.lead is not None}
            if shared:
                attributes["inferd.shared"] = sorted(shared)
        elif trace.generation is not None:
            attributes.update(self._generation(trace.generation, context, trace.started))
        self._processor.on_end(self._readable(
            f"POST {trace.route}", context, trace.parent, self._resource, attributes, kind=self._api.SpanKind.SERVER,
            status=self._error if status >= 500 else self._unset,
            start_time=self._ns(trace.started), end_time=self._ns(now), instrumentation_scope=self._scope))

    def _generation(self, g: Generated, context: Any, started: float) -> dict[str, Any]:
        """A generation's stages as children (`prefill`: queued in the engine and the prompt's prefill,
        to the first token; `decode`: to the last), and its attributes (OpenTelemetry's gen_ai names)."""
        stages = (("admission", started, g.admitted_at), ("tokenize", g.admitted_at, g.tokenized_at),
                  ("prefill", g.tokenized_at, g.first_token_at), ("decode", g.first_token_at, g.finished_at))
        for name, begin, end in stages:
            if begin and end:
                self._write(name, context, self._ns(begin), self._ns(end),
                            {"inferd.engine_request_id": g.engine_request_id} if name in ("prefill", "decode") else None)
        attributes: dict[str, Any] = {"inferd.engine_request_id": g.engine_request_id,
                                      "gen_ai.usage.input_tokens": g.prompt_tokens,
                                      "gen_ai.usage.output_tokens": g.completion_tokens}
        if g.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [g.finish_reason]
        return attributes

    def _write(self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: dict | None = None,
               links: Any = ()) -> Any:
        """A finished span (a child of `parent`, or the root of a trace of its own); returns its context."""
        context = self._context(parent.trace_id if parent is not None else None)
        self._processor.on_end(self._readable(
            name, context, parent, self._resource, attributes, links=links, start_time=start_ns,
            end_time=max(start_ns, end_ns), instrumentation_scope=self._scope))
        return context

    def batch(self, batch: Batch, model: str) -> None:
        """A finished batch that carries a sampled request: its own span, linked to each of theirs."""
        link = self._api.Link
        links = [link(r.trace.context) for r in batch.requests if r.trace is not None]
        links += [link(rider.trace.context) for r in batch.requests for rider in r.riders or () if rider.trace is not None]
        if not links:
            return
        first = batch.requests[0]
        batch.span = self._write("batch", None, self._ns(batch.started_at), self._ns(batch.finished_at), {
            "inferd.model": model, "inferd.batch_id": batch.batch_id, "inferd.batch_size": batch.size,
            "inferd.bucket": first.bucket, "inferd.trigger": batch.trigger, "inferd.worker": batch.worker,
            "inferd.error": batch.error is not None}, links)

    def shutdown(self) -> None:
        """Send what is still queued, for `flush_timeout_s` at most: the exporter's own retries (OTLP backs
        off for a minute and more against a collector that is down) go on in a daemon thread, abandoned."""
        sender = threading.Thread(target=self._processor.shutdown, name="spans-flush", daemon=True)
        sender.start()
        sender.join(self.flush_timeout_s)
        if sender.is_alive():
            log.warning("tracing: spans still unsent after %.1f s at shutdown are dropped", self.flush_timeout_s)


class ClientDecisions:
    """A token bucket for clients' "sampled" decisions: `per_s` a second, a second's worth at once."""

    __slots__ = ("per_s", "tokens", "at")

    def __init__(self, per_s: float) -> None:
        self.per_s, self.tokens, self.at = per_s, max(1.0, per_s), 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(max(1.0, self.per_s), self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens >= 1.0 and self.per_s > 0:
            self.tokens -= 1.0
            return True
        return False


def _route(route: Any) -> str:
    return route if isinstance(route, str) else route.raw_path.partition("?")[0]


def _exporter(config: TracingConfig) -> Any:
    if config.exporter == "otlp":  # (JSON, encoded by inferd: see otlp_json for why)
        from .otlp_json import OtlpJsonExporter

        return OtlpJsonExporter(config.endpoint, config.flush_timeout_s)
    if config.exporter == "otlp-protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=config.endpoint, timeout=config.flush_timeout_s)
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    out = sys.stderr if config.exporter == "console" else open(config.path, "a", encoding="utf-8")  # noqa: SIM115 (for the process's life)
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")  # one line per span
