"""Who makes room when a model's queue is full: the newest waiting request of the lowest tier below the
newcomer's, else, in the newcomer's own tier, the newest of the heaviest tenant if it holds more than
one request more than the newcomer's tenant (a light tenant is not refused because a heavy one filled
the queue). The newest goes first: it has waited least. Pure: it reads the queues and picks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..messages import PendingRequest
from .request_queue import RequestQueue


def choose_victim(
    request: PendingRequest, queues: Mapping[int, RequestQueue], tiers: Sequence[tuple[str, float | None]],
    tier_rank: Mapping[str, int],
) -> tuple[PendingRequest, RequestQueue] | None:
    """The waiting request to shed for `request`, and the queue (length bucket) it waits in; None when
    the newcomer is the one to refuse. `tiers` highest first, `tier_rank` higher goes first."""
    rank = tier_rank.get(request.tier, 0)
    for name, _ in reversed(tiers):  # lowest tier first
        rank_here = tier_rank[name]
        if rank_here > rank:
            return None
        counts: Counter[str] = Counter()
        for q in queues.values():
            counts.update(q.tenant_live(name))
        if not counts:
            continue
        heaviest, held = counts.most_common(1)[0]
        if rank_here == rank and held <= counts.get(request.tenant, 0) + 1:
            return None
        candidates = [(r, q) for q in queues.values() if (r := q.newest_of(name, heaviest)) is not None]
        return max(candidates, key=lambda rq: rq[0].enqueued_at)
    return None
