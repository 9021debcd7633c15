"""The connection's fast path (`inferd/http/fast_path.py`) on its own: how it reads a body (as
aiohttp's `read_nowait` would), and what it does with a request it hands on to the usual way (a
generation model's, which it learns of only from the body)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.calls.request_ids import RequestIds
from inferd.config import TracingConfig
from inferd.http.fast_path import FastPath, whole_body
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
    client = None

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass

    def pause_reading(self) -> None:
        pass


def payload(connection: Connection, *pieces: bytes) -> StreamReader:
    """A request's body as aiohttp's parser leaves it: fed, then finished."""
    reader = StreamReader(connection, 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    for piece in pieces:
        reader.feed_data(piece)
    reader.feed_eof()
    return reader


async def test_a_request_handed_on_leaves_its_clients_trace_decision_to_the_handler():
    # One sampled traceparent a second: the fast path must not spend it on a request it hands on, or the
    # handler's own draw finds the budget empty and the client's trace is lost (sample_rate 0).
    tracing = Tracing(TracingConfig(enabled=True, sample_rate=0.0, max_client_traced_per_s=1.0), InMemorySpanExporter())
    lifecycle = Lifecycle()
    path = FastPath(GenerationRouting(), None, lifecycle, tracing)  # type: ignore[arg-type]
    connection = Connection()
    body = b'{"model": "tiny", "input": "hello"}'
    message = SimpleNamespace(headers=CIMultiDictProxy(CIMultiDict(SAMPLED)), path="/v1/inference", should_close=False)

    handed_on, unread = path.start(connection, message, payload(connection, body))  # type: ignore[arg-type, misc]

    assert handed_on is message and unread.read_nowait() == body and unread.is_eof()
    assert connection.fast_flight is None and lifecycle.in_flight == 0 and path.inference.identified == 1
    assert tracing.begin(message.headers, time.monotonic(), "/v1/inference") is not None


class Counting(Connection):
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self, resume_parser: bool = True) -> None:
        self.resumed += resume_parser  # (only a resumption that parses again: `feed_eof`'s does not)


async def test_a_body_is_read_as_read_nowait_reads_it_and_only_a_large_one_resumes_the_parser():
    for pieces in ([b'{"input": "a"}'], [b'{"input": ', b'"chunked"}'], [b"x" * 70_000], [b"y" * 40_000] * 4):
        fast_connection, usual_connection = Counting(), Counting()
        fast, usual = payload(fast_connection, *pieces), payload(usual_connection, *pieces)
        assert whole_body(fast) == usual.read_nowait() == b"".join(pieces)
        large = sum(map(len, pieces)) >= 2**16
        assert bool(fast_connection.resumed) is large and usual_connection.resumed >= 1
