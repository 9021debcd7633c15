"""Reading a request's body: the size and time limits, and the JSON object most routes take."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ..errors import Draining, InferdError, PayloadTooLarge, RequestTimeout, UnreadableBody
from ..lifecycle import Lifecycle

IN_FLIGHT = web.RequestKey("inferd.in_flight", bool)  # set by whoever entered the request in the lifecycle (`BodyReader`)


def entered(lifecycle: Lifecycle, request: web.BaseRequest) -> None:
    """`request` is in flight from now on (its handler's answer is owed): counted, and marked so."""
    request[IN_FLIGHT] = True
    lifecycle.enter()


class BodyReader:
    """Reads a request's whole body: at most `max_bytes` (413), within `timeout_s` (408).

    A small body has usually arrived with the headers: then it is taken from the buffer at once, without
    the two awaits of `request.read()`. A body still arriving is not owed an answer yet: while it is
    read a request counted in flight (`IN_FLIGHT`, set by whoever entered it in the lifecycle) steps
    out of the count, so a drain does not wait for a client that stalls half-way (if the drain began
    meanwhile, the request is refused 503 DRAINING once it is in). A request nobody counted is left
    alone: stepping it out took another request's place in the count, and a drain that began then did
    not wait for that one's answer (a slow body to /v2/repository/index turned a computing request's
    200 into 503 DRAINING)."""

    def __init__(self, max_bytes: int, timeout_s: float, lifecycle: Lifecycle) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.lifecycle = lifecycle

        self._ahead: dict[int, bytes | InferdError] = {}  # bodies read before their handler, by request

    async def read_ahead(self, request: web.BaseRequest) -> bytes | InferdError:
        """Read a body before its handler does (which then gets it, or the same error, from `read`);
        `forget` it once the handler is done."""
        try:
            body: bytes | InferdError = await self.read(request)
        except InferdError as error:
            body = error
        self._ahead[id(request)] = body
        return body

    def forget(self, request: web.BaseRequest) -> None:
        self._ahead.pop(id(request), None)

    async def read(self, request: web.BaseRequest) -> bytes:
        if self._ahead:
            ahead = self._ahead.get(id(request))
            if isinstance(ahead, InferdError):
                raise ahead
            if ahead is not None:
                return ahead
        content = request.content
        try:
            body = content.read_nowait() if content.is_eof() else await self._read_arriving(content, IN_FLIGHT in request)
        except RequestPayloadError as exc:  # e.g. a body that says gzip and is not
            raise UnreadableBody(f"body could not be read: {' '.join(str(exc).split())}") from None
        if len(body) > self.max_bytes:
            raise PayloadTooLarge(f"body exceeds {self.max_bytes} bytes")
        return body

    async def _read_arriving(self, content: Any, counted: bool) -> bytes:
        """The chunks as they come, joined once at the end: a bytearray grown chunk by chunk copied itself
        over and over (it grows by an eighth), which for a 5.5 MB body was most of the loop's time.
        `counted`: the request is in flight, and steps out of the count meanwhile."""
        lifecycle, limit = self.lifecycle, self.max_bytes
        parts = [content.read_nowait()]
        size = len(parts[0])
        if counted:
            lifecycle.leave()
        try:
            async with asyncio.timeout(self.timeout_s):
                while not content.is_eof() and size <= limit:
                    chunk = await content.readany()
                    parts.append(chunk)
                    size += len(chunk)
        except TimeoutError:
            raise RequestTimeout(f"request body not received within {self.timeout_s:g} s") from None
        finally:
            if counted:
                lifecycle.enter()
        if lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)
        return b"".join(parts)

