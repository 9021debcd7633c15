"""The replies' bookkeeping, without a server: a first request evicted for room while it runs still
answers, and its repeat then runs afresh."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from inferd.http.idempotency import IdempotentReplies
from inferd.http.responses import WholeResponse


async def test_an_entry_evicted_while_its_request_runs_does_not_break_the_answer():
    replies = IdempotentReplies(auth=None, body=None, ids=None, window_s=60.0, max_keys=1)  # type: ignore[arg-type]
    gate = asyncio.Event()

    async def handler(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return WholeResponse(200, b"{}")

    first = asyncio.ensure_future(replies._first(SimpleNamespace(), handler, ("t", "a"), b"x"))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    second = asyncio.ensure_future(replies._first(SimpleNamespace(), handler, ("t", "b"), b"y"))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the second key evicts the first (max_keys = 1)
    gate.set()
    assert (await first).status == 200 and (await second).status == 200
    assert list(replies._entries) == [("t", "b")]
