"""What `http/connections.py` (and its fast path) rely on inside aiohttp's server: a change there in a
new aiohttp release fails here, by name, rather than as a stalled connection under load."""

from __future__ import annotations

import inspect

from aiohttp import web_protocol
from aiohttp._http_parser import HttpRequestParser
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from inferd.http.connections import GuardedConnection


def test_the_request_handlers_state_the_connection_reads_and_sets_is_still_there():
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    for name in ("_waiter", "_messages", "_current_request", "_request_handler", "_keepalive", "_parser", "_manager",
                 "_next_keepalive_close_time", "_keepalive_handle", "_keepalive_timeout"):
        assert name in slots, name
    assert callable(RequestHandler._process_keepalive) and callable(HttpRequestParser.message_consumed)


def test_aiohttps_request_loop_waits_on_the_waiter_and_pops_queued_messages():
    # The fast path hides the waiter while it parses and wakes it only for what it leaves: that holds
    # while the loop waits on `_waiter` when `_messages` is empty, and otherwise takes from its left.
    source = inspect.getsource(RequestHandler.start)
    assert "self._waiter = loop.create_future()" in source and "self._messages.popleft()" in source
    assert "waiter.set_result(None)" in inspect.getsource(RequestHandler.data_received)
    assert "_ErrInfo" in dir(web_protocol) and GuardedConnection.data_received is not RequestHandler.data_received


def test_a_finished_bodys_reader_keeps_its_chunks_where_the_fast_path_reads_them():
    # `fast_path.whole_body` reads a small finished body from the reader's buffer, because reading it
    # with `read_nowait` resumes the connection's parser (a second pass through `data_received`).
    assert {"_buffer", "_size", "_buffer_offset"} <= set(StreamReader.__slots__)
    assert "self._protocol.resume_reading()" in inspect.getsource(StreamReader._read_nowait_chunk)
