"""What a request queue must hold between any two operations, read off its structure: the counts kept
beside the tiers' queues agree with the requests really waiting there, and every entry a tenant's queue
holds is one the tier maps (a tier without mapped calls holds requests only, which its FIFO fast path
reads as such: a spent entry left behind once stopped a model for good)."""

from __future__ import annotations

from collections import Counter

from inferd.messages import PendingRequest, RequestState
from inferd.scheduling.request_queue import RequestQueue
from inferd.scheduling.tier_queue import CallInputs


def waiting_requests(queue: RequestQueue) -> list[PendingRequest]:
    """Every request waiting in `queue`, checked to stand in it exactly once, where its tier and tenant say."""
    waiting: list[PendingRequest] = []
    for tier in queue._tiers:
        for tenant, items in tier.tenants.items():
            for item in items:
                inputs = item.items if isinstance(item, CallInputs) else (item,)
                for request in inputs:
                    if request.state is RequestState.QUEUED:
                        assert (request.tier, request.tenant) == (tier.name, tenant), request
                        waiting.append(request)
    assert len({id(r) for r in waiting}) == len(waiting), "a request waits twice"
    return waiting


def assert_consistent(queue: RequestQueue) -> None:
    waiting = waiting_requests(queue)
    assert queue.live == len(waiting)
    assert queue.tokens == sum(r.tokens or 1 for r in waiting)
    for tier in queue._tiers:
        assert list(tier.turns) == list(dict.fromkeys(tier.turns)), "a tenant takes two turns"
        assert set(tier.turns) == set(tier.tenants)
        mine = [r for r in waiting if r.tier == tier.name]
        assert tier.live == len(mine)
        assert tier.tenant_live == dict(Counter(r.tenant for r in mine))
        entries = [(tenant, item) for tenant, items in tier.tenants.items() for item in items if isinstance(item, CallInputs)]
        for tenant, entry in entries:
            assert tier.calls.get((tenant, entry.call_id)) is entry, f"an entry of call {entry.call_id} waits unmapped"
            assert entry.live == sum(1 for r in entry.items if r.state is RequestState.QUEUED)
        for (tenant, _), entry in tier.calls.items():
            assert any(item is entry for item in tier.tenants.get(tenant, ())), "a mapped entry is in no queue"
        if not tier.calls:
            assert not entries
