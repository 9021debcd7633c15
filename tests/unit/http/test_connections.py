"""What `http/connections.py` (and its fast path) rely on inside aiohttp's server: a change there in a
new aiohttp release fails here, by name, rather than as a stalled connection under load."""

from __future__ import annotations

import inspect

from aiohttp import web_protocol
from aiohttp._http_parser import HttpRequestParser
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
