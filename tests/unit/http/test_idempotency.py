"""The replies' bookkeeping, without a server: a first request evicted for room while it runs still
answers, and its repeat then runs afresh."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import orjson

from inferd.http.idempotency import ENTRY_BYTES, IdempotentReplies, _Entry
from inferd.http.responses import KeptAnswer, WholeResponse

from ...helpers import FakeClock


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
    assert list(replies._tenants["t"]) == ["b"] and replies.keys == 1


async def test_an_answer_is_kept_for_its_window_and_then_its_key_is_free_again():
    clock = FakeClock()
    replies = IdempotentReplies(auth=None, body=None, ids=None, window_s=0.5, max_keys=10, clock=clock)  # type: ignore[arg-type]

    async def handler(request):  # type: ignore[no-untyped-def]
        return WholeResponse(200, b'{"n": 1}')

    await replies._first(SimpleNamespace(), handler, ("t", "k"), b"x")  # type: ignore[arg-type]
    clock.advance(0.49)
    assert replies._current(("t", "k"), clock()) is not None and replies.keys == 1
    clock.advance(0.02)  # past the window: a repeat runs afresh
    assert replies._current(("t", "k"), clock()) is None and replies.keys == 0


def kept(replies: IdempotentReplies, tenant: str, key: str, body: bytes) -> None:
    """An answer of `body` kept for (tenant, key), as `_first` leaves it."""
    replies._add((tenant, key), entry := _Entry(b"f", asyncio.get_running_loop().create_future()))
    answer = WholeResponse(200, body).kept()
    entry.answered.set_result(answer)
    entry.kept_until = 1e18
    replies._resize(tenant, entry, ENTRY_BYTES + answer.size)
    replies._make_room()


async def test_what_is_kept_is_the_answers_bytes_and_their_bound_is_in_bytes():
    replies = IdempotentReplies(auth=None, body=None, ids=None, window_s=60.0, max_keys=1000, max_bytes=20_000)  # type: ignore[arg-type]
    body = orjson.dumps({"output": "x" * 120, "request_id": "req_1"})  # orjson's buffer is larger than this
    kept(replies, "t", "a", body)
    answer = replies._tenants["t"]["a"].answered.result()
    assert isinstance(answer, KeptAnswer) and answer.body == body and sys.getsizeof(answer.body) < len(body) + 64
    assert replies.held_bytes == ENTRY_BYTES + len(body)
    for i in range(100):  # ~5 kB each: the byte bound holds, whatever the key bound says
        kept(replies, "t", f"k{i}", b"y" * 5_000)
    assert replies.held_bytes <= 20_000 and replies.keys < 10


async def test_a_tenant_sending_many_keys_evicts_its_own_answers_not_anothers():
    replies = IdempotentReplies(auth=None, body=None, ids=None, window_s=60.0, max_keys=10)  # type: ignore[arg-type]
    kept(replies, "light", "mine", b"{}")
    for i in range(50):
        kept(replies, "heavy", f"k{i}", b"{}")
    assert "mine" in replies._tenants["light"] and replies.keys == 10  # the heavy tenant's oldest went instead


async def test_what_the_table_counts_is_what_its_answers_hold():
    """Measured with tracemalloc over kept answers the size of /v1/inference's, within 10%."""
    import gc
    import os
    import tracemalloc

    replies = IdempotentReplies(auth=None, body=None, ids=None, window_s=600.0, max_keys=10**6)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(5_000):
        entry = _Entry(os.urandom(16), loop.create_future())
        replies._add(("acme", f"key-{i}"), entry)
        body = orjson.dumps({"output": f"text {i} " + "y" * 80, "request_id": f"req-{i}", "model": "m", "latency_ms": 51.2})
        kept = WholeResponse(200, body, (("X-Request-ID", f"req-{i}"), ("X-Model-Version", "1"),
                                         ("Server-Timing", "queue;dur=12.345, compute;dur=50.123"))).kept()  # (as kept)
        entry.answered.set_result(kept)
        replies._resize("acme", entry, ENTRY_BYTES + kept.size)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.9 < held / replies.held_bytes < 1.1, held / replies.held_bytes
