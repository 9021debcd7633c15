"""The connection's fast path (`inferd/http/fast_path.py`) on its own: what it does with a request it
hands on to the usual way (a generation model's, which it learns of only from the body)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.config import TracingConfig
from inferd.http.fast_path import FastPath
from inferd.http.request_ids import RequestIds
from inferd.lifecycle import Lifecycle
from inferd.observability.tracing import Tracing

SAMPLED = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


class GenerationRouting:
    """An `InferenceApi` as far as the fast path asks it, whose every call names a generation model."""

    def __init__(self) -> None:
        self.ids, self.body = RequestIds(), SimpleNamespace(max_bytes=1 << 20)
        self.identified = 0

    def identify(self, one, headers) -> None:  # type: ignore[no-untyped-def]
        self.identified += 1

    def route(self, one, body, headers, query):  # type: ignore[no-untyped-def]
        return ("tiny", "1")  # (model, version): the generation API's to answer


class Connection:
    """A connection as the fast path and a `StreamReader` over it ask it."""

    fast_flight = None
    _reading_paused = False

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class Payload:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def read_nowait(self) -> bytes:
        return self.body


async def test_a_request_handed_on_leaves_its_clients_trace_decision_to_the_handler():
    # One sampled traceparent a second: the fast path must not spend it on a request it hands on, or the
    # handler's own draw finds the budget empty and the client's trace is lost (sample_rate 0).
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=0.0, max_client_traced_per_s=1.0), InMemorySpanExporter())
    lifecycle = Lifecycle()
    path = FastPath(GenerationRouting(), lifecycle, tracing)  # type: ignore[arg-type]
    connection = Connection()
    body = b'{"model": "tiny", "input": "hello"}'
    message = SimpleNamespace(headers=CIMultiDictProxy(CIMultiDict(SAMPLED)), path="/v1/inference", should_close=False)

    handed_on, unread = path.start(connection, message, Payload(body))  # type: ignore[arg-type, misc]

    assert handed_on is message and unread.read_nowait() == body and unread.is_eof()
    assert connection.fast_flight is None and lifecycle.in_flight == 0 and path.inference.identified == 1
    assert tracing.begin(message.headers, time.monotonic(), "/v1/inference") is not None
