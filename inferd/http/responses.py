"""JSON responses, written whole: status line, headers and body as one piece of bytes, one write.

Why: aiohttp's own `Response` assembles its headers through a multidict and several awaits on every
request, about a third of the CPU of a minimal request on this server's shape (a bare handler: 185k
instructions per request with `web.Response`, 120k with this, measured with callgrind). Parsing,
keep-alive and the connection stay aiohttp's: a `WholeResponse` is a `StreamResponse` whose `prepare`
writes the bytes through the request's own writer (with its back-pressure) and whose `write_eof` has
nothing left to do. Only values this server makes go into headers (request ids are checked on the way
in), so nothing a client sent can split a header line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from aiohttp import web

from ..errors import InferdError
from ..wire.json_values import dumps

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_date_second = -1
_date_header = b""


def _date() -> bytes:
    """The Date header's value, formatted once a second."""
    global _date_second, _date_header
    now = int(time.time())
    if now != _date_second:
        _date_second, _date_header = now, formatdate(now, usegmt=True).encode()
    return _date_header


def answer_bytes(status: int, body: bytes, extra: tuple[tuple[str, str], ...], keep_alive: bool,
                 content_type: bytes = b"application/json", head_only: bool = False) -> bytes:
    """Status line, headers and body, as one piece of bytes."""
    head = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status, _REASONS.get(status, b"Unknown"), content_type, len(body))]
    for name, value in extra:
        head.append(f"{name}: {value}\r\n".encode())
    if not keep_alive:
        head.append(b"Connection: close\r\n")
    head.append(b"Date: %s\r\nServer: inferd\r\n\r\n" % _date())
    if not head_only:
        head.append(body)
    return b"".join(head)


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    """An answer's bytes and headers, without a response object (nor an encoder's larger buffer: the
    body is copied to its own length)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]
    close: bool
    content_type: bytes

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(name) + len(value) for name, value in self.headers)

    def replayed(self) -> WholeResponse:
        """The same answer again, for a repeat of its request, marked as such."""
        return WholeResponse(self.status, self.body, (*self.headers, ("Idempotent-Replayed", "true")), close=self.close,
                             content_type=self.content_type)


class WholeResponse(web.StreamResponse):
    """A complete JSON response; `headers` are extra (name, value) pairs besides the usual ones."""

    def __init__(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...] = (), *, close: bool = False,
                 drop_body: bool = False, content_type: bytes = b"application/json") -> None:
        super().__init__(status=status)
        self._media_type = content_type  # (not aiohttp's `_content_type`, a str it reads itself)
        self._whole_body = body
        self._extra = headers
        self._close = close or drop_body
        self._drop_body = drop_body  # close at once, without reading what is left of the request body

    def kept(self) -> KeptAnswer:
        """What it says, kept to be said again (`Idempotency-Key`): exactly its bytes."""
        return KeptAnswer(self.status, bytes(memoryview(self._whole_body)), self._extra, self._close, self._media_type)

    async def prepare(self, request: web.BaseRequest) -> None:
        if self._eof_sent:
            return None
        self._eof_sent = True
        keep_alive = not self._close and request.keep_alive and self._keep_alive is not False  # (force_close())
        self._keep_alive = keep_alive
        await request.writer.write(self.encoded(keep_alive, request.method == "HEAD"))
        if self._drop_body:
            request.protocol.force_close()  # (the transport sends what was written, then closes)
        return None

    closes = property(lambda self: self._close, doc="Whether the connection closes after it, whatever the client asked.")

    def encoded(self, keep_alive: bool, head_only: bool = False) -> bytes:
        """The whole answer as it goes out (a HEAD's answer says how long the body is, and sends none)."""
        return answer_bytes(self._status, self._whole_body, self._extra, keep_alive and not self._close,
                            self._media_type, head_only)

    async def write_eof(self, data: bytes = b"") -> None:
        return None  # everything went out in `prepare`


def json_response(payload: Any, request_id: str, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> WholeResponse:
    return WholeResponse(status, dumps(payload), (("X-Request-ID", request_id), *headers))


_OPENAI_PATHS = frozenset({"/v1/embeddings", "/embeddings", "/v1/completions", "/v1/chat/completions", "/v1/models"})


def openai_path(raw_path: str) -> bool:
    """A route of OpenAI's API (`/v1/models/{id}` too): its errors come in OpenAI's shape whatever their
    cause (an OpenAI client reads no other), even where this server does not serve the route."""
    path = raw_path.partition("?")[0]
    return path in _OPENAI_PATHS or path.startswith("/v1/models/")


def error_response(
    error: InferdError, request_id: str, *, close: bool = False, openai: bool = False, allow: str | None = None,
    open_inference: bool = False, held_s: float | None = None,
) -> WholeResponse:
    """inferd's error shape (`{"error": CODE, "message", "request_id"}`, plus `retry_after_ms` and a
    Retry-After header for a 429 or 503), OpenAI's (`{"error": {"message", "type", "code", ...}}`), or
    the Open Inference Protocol's (`{"error": message}`, inferd's `code` beside it).
    `close`: the connection closes after it (draining); `allow`: the Allow header of a 405; `held_s`:
    how long the server held the request (`Server-Timing: total`, e.g. how fast a refusal came), beside
    the error's own entries (a refusal's predicted completion, margin and budget)."""
    # A raised error's traceback holds the handler's frame, and with it the request whose future holds the
    # error: a cycle only the cyclic collector would free. Answered, the error needs no traceback.
    error.__traceback__ = None
    headers: tuple[tuple[str, str], ...] = (("X-Request-ID", request_id),)
    if held_s is not None:
        total = f"total;dur={held_s * 1000:.3f}"
        headers += (("Server-Timing", total if error.server_timing is None else f"{total}, {error.server_timing}"),)
    elif error.server_timing is not None:
        headers += (("Server-Timing", error.server_timing),)
    if allow is not None:
        headers += (("Allow", allow),)
    if error.status == 401:
        headers += (("WWW-Authenticate", 'Bearer realm="inferd"'),)
    if error.retry_after_ms is not None:
        headers += (("Retry-After", str(max(1, math.ceil(error.retry_after_ms / 1000)))),)
    payload: dict[str, Any]
    if open_inference:
        payload = {"error": error.message, "code": error.code, "request_id": request_id}
        if error.retry_after_ms is not None:
            payload["retry_after_ms"] = error.retry_after_ms
    elif openai:
        inner: dict[str, Any] = {"message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
                                 "param": None, "code": error.code}
        if error.retry_after_ms is not None:
            inner["retry_after_ms"] = error.retry_after_ms
        payload = {"error": inner, "request_id": request_id}
    else:
        payload = {"error": error.code, "message": error.message, "request_id": request_id}
        if error.retry_after_ms is not None:
            payload["retry_after_ms"] = error.retry_after_ms
    return WholeResponse(error.status, dumps(payload), headers, close=close, drop_body=error.drops_connection)


# OpenAI's error `type` by HTTP status; inferd's own stable code goes in `code`.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}
