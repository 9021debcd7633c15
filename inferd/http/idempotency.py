"""`Idempotency-Key`: a request retried with the same key is answered once.

Keys are scoped by tenant. A repeat of a key whose first request is still running waits for that
answer (on routes that can share it; on the generation routes, 409 IDEMPOTENCY_KEY_IN_USE, since a
stream cannot be replayed); a repeat within `idempotency_window_s` of the answer gets the same answer
again, marked `Idempotent-Replayed: true`; a repeat with a different body (or path) gets 422
IDEMPOTENCY_KEY_REUSED; a repeat of a streamed answer that was sent gets 409 (it cannot be replayed,
and generating it again would give one key two samples). Only definite answers are kept: a result, or a refusal of the request itself
(400, 404, 413, 422); an answer a retry may change (401, 408, 429, 5xx, a client gone) is forgotten, so
the retry runs. Without the header nothing here runs.

What is kept is exactly the answer's bytes (status, headers, body: not the response object, nor an
encoder's larger buffer), counted against `idempotency_max_bytes` as well as `idempotency_max_keys`.
Room is made from the tenant holding the most bytes (its oldest answer first): one tenant's stream of
unique keys cannot push another's answers out inside their window.
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
from ..calls.request_ids import RequestIds
from ..errors import IdempotencyKeyInUse, IdempotencyKeyReused, InferdError, InvalidInput
from .body_reader import BodyReader
from .responses import KeptAnswer, WholeResponse, error_response

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
KEPT_STATUSES = frozenset((200, 400, 404, 413, 422))
MAX_KEY_CHARS = 255
# What an entry holds besides its answer's body and header text: the key, the fingerprint, the entry, its
# future, the table's node, the header tuples (tracemalloc over 20,000 entries: 582 bytes each).
ENTRY_BYTES = 600


@dataclass(slots=True, eq=False)
class _Entry:
    fingerprint: bytes  # of the path and body
    answered: asyncio.Future[KeptAnswer | None]  # the answer to replay, or None: run again
    kept_until: float = float("inf")  # while running: kept
    size: int = ENTRY_BYTES  # what it holds, once answered


@dataclass
class IdempotentReplies:
    """Answers by (tenant, key), for `window_s` after they were given; at most `max_keys` of them and
    `max_bytes` of what they hold."""

    auth: Authenticator
    body: BodyReader
    ids: RequestIds
    window_s: float
    max_keys: int
    max_bytes: int = 64 << 20
    clock: Callable[[], float] = time.monotonic  # (a fake one in tests: the window is time)
    replays: int = 0
    keys: int = 0
    held_bytes: int = 0
    _tenants: dict[str, OrderedDict[str, _Entry]] = field(default_factory=dict)  # each in order of expiry
    _tenant_bytes: dict[str, int] = field(default_factory=dict)

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
            entry = self._current(scoped, self.clock())
            if entry is None:
                return await self._first(request, handler, scoped, fingerprint)
            if entry.fingerprint != fingerprint:
                reused = IdempotencyKeyReused("this Idempotency-Key was used with a different request")
                return error_response(reused, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai)
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
        self._add(scoped, entry)
        kept = None
        try:
            response = await handler(request)
            if isinstance(response, WholeResponse) and response.status in KEPT_STATUSES:
                kept = response.kept()
            elif response.status == 200 and response.prepared:  # a stream, sent: repeats must not generate again
                error = IdempotencyKeyInUse("the answer to this Idempotency-Key was a stream, which cannot be replayed; "
                                            "send a new key to generate again")
                kept = error_response(error, self.ids.pick(request.headers.get("X-Request-ID"))).kept()
            return response
        finally:
            entry.answered.set_result(kept)
            tenant, key = scoped
            held = self._tenants.get(tenant)
            mine = held is not None and held.get(key) is entry  # (not when it was evicted for room meanwhile)
            if kept is not None and mine:
                entry.kept_until = self.clock() + self.window_s
                self._tenants[tenant].move_to_end(key)  # (in order of expiry, for `_current`)
                self._resize(tenant, entry, ENTRY_BYTES + kept.size)
                self._make_room()
            elif mine:
                self._remove(tenant, key)

    def _current(self, scoped: tuple[str, str], now: float) -> _Entry | None:
        tenant, key = scoped
        entries = self._tenants.get(tenant)
        if entries is None:
            return None
        for old_key in [k for k, old in islice(entries.items(), 8) if old.kept_until <= now]:
            self._remove(tenant, old_key)  # (a few of the oldest answers past the window, each time)
        entry = entries.get(key)
        if entry is not None and entry.kept_until <= now:
            self._remove(tenant, key)
            return None
        return entry

    def _add(self, scoped: tuple[str, str], entry: _Entry) -> None:
        tenant, key = scoped
        entries = self._tenants.setdefault(tenant, OrderedDict())
        if key in entries:
            self._remove(tenant, key)
        entries[key] = entry
        self.keys += 1
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + entry.size
        self.held_bytes += entry.size
        self._make_room()

    def _resize(self, tenant: str, entry: _Entry, size: int) -> None:
        self._tenant_bytes[tenant] += size - entry.size
        self.held_bytes += size - entry.size
        entry.size = size

    def _remove(self, tenant: str, key: str) -> None:
        entries = self._tenants[tenant]
        entry = entries.pop(key)
        self.keys -= 1
        self.held_bytes -= entry.size
        held = self._tenant_bytes[tenant] - entry.size
        if entries:
            self._tenant_bytes[tenant] = held
        else:
            del self._tenants[tenant], self._tenant_bytes[tenant]

    def _make_room(self) -> None:
        """Past either bound, the oldest answer of the tenant holding the most bytes goes first."""
        while self.keys > self.max_keys or self.held_bytes > self.max_bytes:
            heaviest = max(self._tenant_bytes, key=self._tenant_bytes.__getitem__)
            self._remove(heaviest, next(iter(self._tenants[heaviest])))


def _fingerprint(path: str, body: bytes) -> bytes:
    return hashlib.blake2b(path.encode() + b"\0" + body, digest_size=16).digest()
