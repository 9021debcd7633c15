"""The limits on connections (`connections`), and what a connection holding one of the last
`connection_reserve` descriptors may ask: `/healthz` and `/readyz` (one answer, then it closes, so the
descriptor is free again); anything else is a 503 that closes it. A load balancer still sees how a
host flooded with connections is doing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from ..calls.request_ids import RequestIds
from ..errors import ServiceOverloaded
from .responses import error_response, openai_path

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    connection_reserve: int  # of those, kept for health checks
    header_timeout_s: float
    answer_half_closed: bool = False  # a client's end of input is not its going away (see eof_received)


class ReservingServer(Protocol):
    """What the reserve needs of the server (`connections.GuardedServer`)."""

    limits: ConnectionLimits
    ids: RequestIds
    open: int
    reserved: int  # requests refused on a reserved connection
    request_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


async def health_only(server: ReservingServer, request: web.BaseRequest) -> web.StreamResponse:
    """A reserved connection's request handler."""
    if request.path in HEALTH_PATHS:
        response = await server.request_handler(request)
        response.force_close()  # one answer, then the reserved descriptor is free again
        return response
    server.reserved += 1
    error = ServiceOverloaded(f"{server.open} connections are open; the last {server.limits.connection_reserve} "
                              "are kept for health checks", retry_after_ms=1000, reason="connections")
    return error_response(error, server.ids.pick(request.headers.get("X-Request-ID")), close=True,
                          openai=openai_path(request.raw_path))
