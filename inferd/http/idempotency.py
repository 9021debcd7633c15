"""`Idempotency-Key`: a request retried with the same key is answered once.

Keys are scoped by tenant. A repeat of a key whose first request is still running waits for that
answer (on routes that can share it; on the generation routes, 409 IDEMPOTENCY_KEY_IN_USE, since a
stream cannot be replayed); a repeat within `idempotency_window_s` of the answer gets the same answer
again, marked `Idempotent-Replayed: true`; a repeat with a different body (or path) gets 422
IDEMPOTENCY_KEY_REUSED. Only definite answers are kept: a result, or a refusal of the request itself
(400, 404, 413, 422); an answer a retry may change (401, 408, 429, 5xx, a client gone) is forgotten, so
the retry runs. Without the header nothing here runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import islice

from aiohttp import web

from ..admission.auth import Authenticator
from ..errors import IdempotencyKeyInUse, IdempotencyKeyReused, InferdError, InvalidInput
from .protocol import BodyReader, RequestIds
from .responses import WholeResponse, error_response

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
KEPT_STATUSES = frozenset((200, 400, 404, 413, 422))
MAX_KEY_CHARS = 255


@dataclass(slots=True, eq=False)
class _Entry:
    fingerprint: bytes  # of the path and body
    answered: asyncio.Future[WholeResponse | None]  # the answer to replay, or None: run again
    kept_until: float = float("inf")  # while running: kept


@dataclass
class IdempotentReplies:
    """Answers by (tenant, key), for `window_s` after they were given; at most `max_keys` of them."""

    auth: Authenticator
    body: BodyReader
    ids: RequestIds
    window_s: float
    max_keys: int
    replays: int = 0
    _entries: OrderedDict[tuple[str, str], _Entry] = field(default_factory=OrderedDict)

    def wrap(self, handler: Handler, *, join: bool, openai: bool = False) -> Handler:
        """`handler` with keyed requests answered once. `join`: a repeat waits for a running first one."""
        if self.window_s <= 0:
            return handler

        async def idempotent(request: web.BaseRequest) -> web.StreamResponse:
            key = request.headers.get("Idempotency-Key")
            if not key:
                return await handler(request)
            if len(key) > MAX_KEY_CHARS:
                error = InvalidInput(f"Idempotency-Key is {len(key)} characters; at most {MAX_KEY_CHARS}")
                return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai)
            try:
                tenant = self.auth.identify(request.headers).tenant
            except InferdError:
                return await handler(request)  # (which finds the same failure and answers it)
            body = await self.body.read_ahead(request)  # (the handler gets it, or its failure, from there)
            try:
                if isinstance(body, InferdError):
                    return await handler(request)
                return await self._answer(request, handler, (tenant, key), _fingerprint(request.raw_path, body), join,
                                          openai)
            finally:
                self.body.forget(request)

        return idempotent

    async def _answer(
        self, request: web.BaseRequest, handler: Handler, scoped: tuple[str, str], fingerprint: bytes, join: bool,
        openai: bool,
    ) -> web.StreamResponse:
        while True:
            entry = self._current(scoped, time.monotonic())
            if entry is None:
                return await self._first(request, handler, scoped, fingerprint)
            if entry.fingerprint != fingerprint:
                error = IdempotencyKeyReused("this Idempotency-Key was used with a different request")
                return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai)
            if not entry.answered.done() and not join:
                error = IdempotencyKeyInUse("the request with this Idempotency-Key is still running", retry_after_ms=1000)
                return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai)
            answer = await asyncio.shield(entry.answered)
            if answer is not None:
                self.replays += 1
                return answer.replayed()
            # the first one's answer was not kept (e.g. 503): this repeat runs, unless another began meanwhile

    async def _first(
        self, request: web.BaseRequest, handler: Handler, scoped: tuple[str, str], fingerprint: bytes
    ) -> web.StreamResponse:
        entry = _Entry(fingerprint, asyncio.get_running_loop().create_future())
        self._entries[scoped] = entry
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)
        kept = None
        try:
            response = await handler(request)
            if isinstance(response, WholeResponse) and response.status in KEPT_STATUSES:
                kept = response
            return response
        finally:
            entry.answered.set_result(kept)
            mine = self._entries.get(scoped) is entry  # (not when it was evicted for room meanwhile)
            if kept is not None and mine:
                entry.kept_until = time.monotonic() + self.window_s
                self._entries.move_to_end(scoped)  # (in order of expiry, for `_current`)
            elif mine:
                del self._entries[scoped]

    def _current(self, scoped: tuple[str, str], now: float) -> _Entry | None:
        entries = self._entries
        for old_key in [k for k, old in islice(entries.items(), 8) if old.kept_until <= now]:
            del entries[old_key]  # (a few of the oldest answers past the window, each time)
        entry = entries.get(scoped)
        if entry is not None and entry.kept_until <= now:
            del entries[scoped]
            return None
        return entry


def _fingerprint(path: str, body: bytes) -> bytes:
    return hashlib.blake2b(path.encode() + b"\0" + body, digest_size=16).digest()
