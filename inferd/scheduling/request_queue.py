"""A model's waiting requests: one queue per tier, and inside a tier one FIFO per tenant.

A batch is filled from the highest tier down; inside a tier, tenants take turns (round robin), so one
tenant's burst cannot take every slot of a batch. A request that has waited past its tier's
`promote_after` is served before any tier order (the starvation guard).

Not thread-safe by itself: the batcher holds its lock around every call. Cancelled and expired
requests stay in their deque as tombstones until they reach its head, so a client going away costs
O(1) instead of a linear removal; `live` counts only the requests still waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from ..messages import PendingRequest, RequestState

_QUEUED = RequestState.QUEUED


class _TierQueue:
    __slots__ = ("name", "promote_after_s", "tenants", "turns", "live")

    def __init__(self, name: str, promote_after_s: float | None) -> None:
        self.name = name
        self.promote_after_s = promote_after_s
        self.tenants: dict[str, deque[PendingRequest]] = {}
        self.turns: deque[str] = deque()  # tenants with (possibly) waiting requests, in turn order
        self.live = 0

    def head(self, tenant: str) -> PendingRequest | None:
        items = self.tenants[tenant]
        while items and items[0].state is not _QUEUED:
            items.popleft()
        return items[0] if items else None

    def heads(self) -> Iterator[PendingRequest]:
        for tenant in list(self.turns):
            head = self.head(tenant)
            if head is None:
                self.turns.remove(tenant)
                del self.tenants[tenant]
            else:
                yield head


class RequestQueue:
    """One length bucket's waiting requests: a FIFO per tenant inside a queue per tier."""

    def __init__(self, tiers: Iterable[tuple[str, float | None]] = (("default", None),)) -> None:
        """`tiers`: (name, promote_after_s), highest priority first."""
        self._tiers = [_TierQueue(name, promote) for name, promote in tiers]
        self._by_name = {t.name: t for t in self._tiers}
        self._promoting = any(t.promote_after_s is not None for t in self._tiers)
        self.live = 0

    def live_by_tier(self) -> dict[str, int]:
        return {t.name: t.live for t in self._tiers}

    def live_ahead_of(self, tier: str) -> int:
        """Waiting requests a new request of `tier` would queue behind: its own tier and those above it."""
        ahead = 0
        for t in self._tiers:
            ahead += t.live
            if t.name == tier:
                break
        return ahead

    def append(self, request: PendingRequest) -> None:
        tier, items = self._tenant_queue(request, front=False)
        items.append(request)
        tier.live += 1
        self.live += 1

    def appendleft(self, requests: list[PendingRequest]) -> None:
        """Put requests back at the head of their tenants' queues, oldest first (a batch to run again)."""
        for request in reversed(requests):
            request.state = _QUEUED
            tier, items = self._tenant_queue(request, front=True)
            items.appendleft(request)
            tier.live += 1
            self.live += 1

    def _tenant_queue(self, request: PendingRequest, front: bool) -> tuple[_TierQueue, deque[PendingRequest]]:
        """The FIFO of the request's tenant in its tier; a tenant new to the tier joins the turns."""
        tier = self._by_name[request.tier]
        items = tier.tenants.get(request.tenant)
        if items is None:
            items = tier.tenants[request.tenant] = deque()
            if front:
                tier.turns.appendleft(request.tenant)
            else:
                tier.turns.append(request.tenant)
        return tier, items

    def remove(self, request: PendingRequest, new_state: RequestState) -> bool:
        """Take a still-queued request out; False if it already left (taken, expired, cancelled)."""
        if request.state is not _QUEUED:
            return False
        request.state = new_state
        tier = self._by_name[request.tier]
        tier.live -= 1
        self.live -= 1
        items = tier.tenants.get(request.tenant)
        if items is not None and len(items) > 64 and len(items) > 4 * tier.live:
            tier.tenants[request.tenant] = deque(r for r in items if r.state is _QUEUED)
        return True

    def oldest(self) -> PendingRequest | None:
        """The longest-waiting live request (its age drives the linger)."""
        oldest = None
        for tier in self._tiers:
            if tier.live:
                for head in tier.heads():
                    if oldest is None or head.enqueued_at < oldest.enqueued_at:
                        oldest = head
        return oldest

    def oldest_age_by_tier(self, now: float) -> dict[str, float]:
        ages = {}
        for tier in self._tiers:
            heads = [h.enqueued_at for h in tier.heads()] if tier.live else []
            ages[tier.name] = now - min(heads) if heads else 0.0
        return ages

    def take(self, limit: int, now: float) -> list[PendingRequest]:
        """Pop up to `limit` live requests: promoted ones, then tier by tier with tenants in turn.

        Requests whose deadline passed are dropped, never run (their deadline timer answers 504).
        """
        taken: list[PendingRequest] = []
        if self._promoting:
            self._take_promoted(taken, limit, now)
        for tier in self._tiers:
            while tier.live and len(taken) < limit:
                tenant = tier.turns[0]
                head = tier.head(tenant)
                if head is None:
                    tier.turns.popleft()
                    del tier.tenants[tenant]
                    continue
                tier.tenants[tenant].popleft()
                tier.turns.rotate(-1)
                self._claim(tier, head, now, taken)
            if len(taken) >= limit:
                break
        return taken

    def _take_promoted(self, taken: list[PendingRequest], limit: int, now: float) -> None:
        for tier in self._tiers[1:]:  # the top tier needs no promotion
            if tier.promote_after_s is None or not tier.live:
                continue
            cutoff = now - tier.promote_after_s
            for tenant in list(tier.turns):
                while len(taken) < limit:
                    head = tier.head(tenant)
                    if head is None or head.enqueued_at > cutoff:
                        break
                    tier.tenants[tenant].popleft()
                    self._claim(tier, head, now, taken)

    def _claim(self, tier: _TierQueue, request: PendingRequest, now: float, taken: list[PendingRequest]) -> None:
        tier.live -= 1
        self.live -= 1
        if request.deadline <= now:
            request.state = RequestState.EXPIRED
        else:
            request.state = RequestState.TAKEN
            taken.append(request)

    def drain(self) -> Iterator[PendingRequest]:
        """Remove and yield every live request (shutdown, breaker)."""
        for tier in self._tiers:
            for items in tier.tenants.values():
                for request in items:
                    if request.state is _QUEUED:
                        request.state = RequestState.CANCELLED
                        tier.live -= 1
                        self.live -= 1
                        yield request
            tier.tenants.clear()
            tier.turns.clear()
