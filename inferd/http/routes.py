"""A route of the HTTP surface as its handler declares it: the method it answers, and its policy
beside it (whether a drain waits for it, whether an `Idempotency-Key` is honoured on it and how, and
whether its errors take OpenAI's shape), so that the route table (`api`) reads one record a path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, NamedTuple

from aiohttp import web

from ..calls.context import CallContext
from .call_tracing import CallHandler, traced_route

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
PathHandler = Callable[[web.BaseRequest, str], Awaitable[web.StreamResponse]]  # (a prefix's: it routes the rest)
# An Idempotency-Key on a route: "" not honoured; "join": a repeat while the first runs waits for its
# answer; "once": that repeat is refused (a stream is not shared).
Keyed = Literal["", "join", "once"]


class Route(NamedTuple):
    """An exact path's route."""

    method: str
    handler: Handler
    counted: bool = False  # in flight while it runs: a drain waits for it
    keyed: Keyed = ""
    openai_errors: bool = False  # its errors (a keyed repeat's too) in OpenAI's shape


def call_route(context: CallContext, handler: CallHandler, *, keyed: Keyed = "join", openai_errors: bool = False) -> Route:
    """A call's route: POSTed, counted, traced where the server traces (`call_tracing.traced_route`)."""
    routed: Handler = handler if context.tracing is None else traced_route(context.tracing, context.ids, handler)
    return Route("POST", routed, True, keyed, openai_errors)
