"""One length bucket's waiting requests: one queue per tier, and inside a tier one queue per tenant.

A batch is filled from the highest tier down; inside a tier, tenants take turns (round robin), so one
tenant's burst cannot take every slot of a batch. Inside a tenant, its calls take turns too: a call of
one input is one entry of the tenant's FIFO, and the inputs of a multi-input call (/v1/embeddings,
/v1/rerank, a v2 tensor) wait together as one entry that gives up one input per turn and goes back to
the end, so a 10-document call is not served after every pair of the 100-document calls queued before
it; a call with at most `whole_call` inputs waiting goes whole in its turn (see `tier_queue`). A
request that has waited past its tier's `promote_after` is served before any tier order (the
starvation guard). A batch stops at its size limit and at its token budget (a request without a token
count costs one).

Not thread-safe by itself: the batcher holds its lock around every call. Cancelled and expired
requests stay in their deque as tombstones until they reach its head, so a client going away costs
O(1) instead of a linear removal; `live` counts only the requests still waiting (and each tenant's
share of them, which shedding reads).

Why one module: the tiers' queues (each a `TierQueue`), their tombstones and the counts kept beside
them are one structure's invariants; what reads it (the rule's view, taking a batch, admission's count
of what is ahead, shedding) must see them kept together.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import cast

from ..messages import PendingRequest, RequestState
from .batch_filling import BatchFilling, tokens_of
from .policy import BucketView
from .queue_dues import DueHeap
from .tier_queue import CallInputs, TierQueue

_QUEUED = RequestState.QUEUED


class RequestQueue:
    """One length bucket's waiting requests: a FIFO per tenant inside a queue per tier."""

    def __init__(self, tiers: Iterable[tuple[str, float | None]] = (("default", None),), whole_call: int = 1) -> None:
        """`tiers`: (name, promote_after_s), highest priority first; `whole_call`: a call with at most this
        many inputs waiting goes whole in its turn."""
        tiers = list(tiers)
        self._tiers = [TierQueue(name, len(tiers) - i, promote, whole_call) for i, (name, promote) in enumerate(tiers)]
        self._by_name = {t.name: t for t in self._tiers}
        self._promoting = any(t.promote_after_s is not None for t in self._tiers)
        self.live = 0
        self.tokens = 0  # the waiting requests' tokens (see `batch_filling.tokens_of`)
        # While the batcher coroutine sleeps, a request due before this may make the bucket due sooner
        # than the sleep ends: it wakes the coroutine (`Batcher.submit`; set by `Batcher.dispatch`).
        self.wake_before = -math.inf
        # The earliest due among the waiting requests (`_earliest_due`): the heads' while they joined in
        # the order of their dues (the latest so far kept here), else a heap of them all (`queue_dues`).
        self._latest_due = -math.inf
        self._due_heap: DueHeap | None = None

    def live_by_tier(self) -> dict[str, int]:
        return {t.name: t.live for t in self._tiers}

    def live_ahead_of(self, tier: str, tenant: str | None = None, call_id: str | None = None) -> int:
        """Waiting requests a new request of `tier` (and `tenant`; one input of call `call_id`, if it is one of a
        multi-input call's) would wait behind, as the turns order them: every one of the tiers above; in
        its own tier, its tenant's requests its turn comes after (`TierQueue.own_ahead`: a small call
        does not wait behind every input of the big calls queued before it), and, with tenants taking
        turns, as many of each other tenant's as its own tenant takes turns until it (a light tenant
        waits behind a heavy one's first few, not its backlog)."""
        ahead = 0
        for t in self._tiers:
            if t.name != tier:
                ahead += t.live
                continue
            if tenant is None:
                return ahead + t.live
            mine = t.own_ahead(tenant, call_id)
            if len(t.tenant_live) == 1 and tenant in t.tenant_live:
                return ahead + mine
            return ahead + mine + sum(min(n, mine + 1) for name, n in t.tenant_live.items() if name != tenant)
        return ahead

    def has_calls(self) -> bool:
        """Whether a multi-input call waits here (without one, a tenant's requests go in FIFO order)."""
        for tier in self._tiers:  # (asked per bucket of every request admission asks: no generator)
            if tier.calls:
                return True
        return False

    def tenant_live(self, tier: str) -> dict[str, int]:
        return self._by_name[tier].tenant_live

    def append(self, request: PendingRequest) -> None:
        if not self.live:  # (empty: the dues of what joins next start a new order)
            self._latest_due, self._due_heap = -math.inf, None
        tier, items = self._tenant_queue(request, front=False)
        if request.call_id is None:
            items.append(request)
        else:  # one input of a multi-input call: into the call's entry (a new one at the end if it has none)
            entry = tier.calls.get((request.tenant, request.call_id))
            if entry is None:
                entry = tier.calls[(request.tenant, request.call_id)] = CallInputs(request.call_id, request.call_size <= tier.whole_call)
                items.append(entry)
            entry.items.append(request)
            entry.live += 1
        self._joined(tier, request)
        heap = self._due_heap
        if heap is None:
            if request.due >= self._latest_due:
                self._latest_due = request.due
            else:  # due before a request already waiting: from now on, the heap
                self._due_heap = DueHeap(self._waiting())
        else:
            heap.add(request)
            if len(heap) > 4 * self.live + 64:  # (tombstones a long due kept below the top)
                heap.rebuild(self._waiting())

    def appendleft(self, requests: list[PendingRequest]) -> None:
        """Put requests back at the head of their tenants' queues, oldest first (a batch to run again):
        each waits there alone, out of its call's turns."""
        for request in reversed(requests):
            request.state = _QUEUED
            request.call_id = None
            tier, items = self._tenant_queue(request, front=True)
            items.appendleft(request)
            self._joined(tier, request)
        if requests:  # (rare: ahead of requests that may be due sooner)
            self._due_heap = DueHeap(self._waiting())

    def _joined(self, tier: TierQueue, request: PendingRequest) -> None:
        tier.live += 1
        tier.tenant_live[request.tenant] = tier.tenant_live.get(request.tenant, 0) + 1
        self.live += 1
        self.tokens += request.tokens or 1

    def _left(self, tier: TierQueue, request: PendingRequest) -> None:
        """`request` stopped waiting (taken, expired, cancelled, shed)."""
        tier.live -= 1
        tenant_live = tier.tenant_live
        n = tenant_live[request.tenant] - 1
        if n:
            tenant_live[request.tenant] = n
        else:
            del tenant_live[request.tenant]
        self.live -= 1
        self.tokens -= request.tokens or 1
        if request.call_id is not None:
            entry = tier.calls.get((request.tenant, request.call_id))
            if entry is not None:  # (gone once its last input was popped)
                entry.live -= 1

    def _tenant_queue(self, request: PendingRequest, front: bool) -> tuple[TierQueue, deque[PendingRequest | CallInputs]]:
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
        self._left(tier, request)
        if not self.live:
            self._latest_due, self._due_heap = -math.inf, None
        items = tier.tenants.get(request.tenant)
        if items is not None and len(items) > 64 and len(items) > 4 * tier.live:
            tier.tenants[request.tenant] = deque(e for e in items if isinstance(e, CallInputs) or e.state is _QUEUED)
        return True

    def promote(self, request: PendingRequest, tier: str) -> None:
        """Move a waiting request to a higher `tier`'s queue (the end of its tenant's FIFO there): an
        identical request of that tier now waits on its computation (collapsing)."""
        old = self._by_name[request.tier]
        old.unlink(request)  # (linear, and rare: only when a higher tier attaches)
        self._left(old, request)
        request.tier = tier
        self.append(request)

    def newest_of(self, tier: str, tenant: str) -> PendingRequest | None:
        """The tenant's waiting request in `tier` that its turn order reaches last (the first to shed: the
        most recent, or the last input of a call served in turns)."""
        return self._by_name[tier].newest(tenant)

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

    def oldest_and_due(self) -> tuple[float, float]:
        """When its oldest waiting request was queued, and the earliest due of a waiting request (inf: empty)."""
        oldest = due = math.inf
        for tier in self._tiers:
            if tier.live:
                for head in tier.heads():
                    if head.enqueued_at < oldest:
                        oldest = head.enqueued_at
                    if head.due < due:
                        due = head.due
        return oldest, self._earliest_due(due)

    def _earliest_due(self, heads_due: float) -> float:
        """The earliest due of a waiting request, `heads_due` being the tenants' heads' (`queue_dues`)."""
        if self._due_heap is not None:
            return self._due_heap.earliest()
        for tier in self._tiers:  # (a call's inputs may wait behind another call's turn in their tenant's queue)
            for entry in tier.calls.values():
                head = entry.head()
                if head is not None and head.due < heads_due:
                    heads_due = head.due
        return heads_due

    def _waiting(self) -> Iterator[PendingRequest]:
        for tier in self._tiers:
            for request in tier.each():
                if request.state is _QUEUED:
                    yield request

    def view(self, key: int, now: float, size_limit: int, batch_s: Callable[[int], float], linger_s: float) -> BucketView:
        """What the scheduling rule needs of this bucket now (see `policy`): `size_limit` is where its
        batch stops growing, `batch_s(n)` what a batch of n costs, `linger_s` how long it may wait."""
        oldest: PendingRequest | None = None
        rank, rank_oldest_at, due, short_at = -math.inf, math.inf, math.inf, math.inf
        for tier in self._tiers:
            if not tier.live:
                continue
            tier_head = None
            for head in tier.heads():
                due = min(due, head.due)
                if tier_head is None or head.enqueued_at < tier_head.enqueued_at:
                    tier_head = head
            if tier_head is None:
                continue
            promote = tier.promote_after_s
            tier_rank = math.inf if promote is not None and now - tier_head.enqueued_at >= promote else tier.rank
            if tier_rank > rank:
                rank, rank_oldest_at, short_at = tier_rank, tier_head.enqueued_at, tier.short_at(tier_head)
            elif tier_rank == rank:
                rank_oldest_at = min(rank_oldest_at, tier_head.enqueued_at)
                short_at = min(short_at, tier.short_at(tier_head))
            if oldest is None or tier_head.enqueued_at < oldest.enqueued_at:
                oldest = tier_head
        if oldest is None:
            return BucketView(key, 0, 0, math.inf, math.inf, -math.inf, math.inf, size_limit, 0.0, linger_s)
        return BucketView(key, self.live, self.tokens, oldest.enqueued_at, self._earliest_due(due), rank, rank_oldest_at, size_limit,
                          batch_s(min(self.live, size_limit)), linger_s, short_at)

    def take(self, limit: int, now: float, token_budget: int | None = None, curve: Sequence[float] | None = None,
             level: float = 1.0, margin: float = 1.0, max_size: int | None = None,
             short_first: bool = False) -> list[PendingRequest]:
        """Pop up to `limit` live requests (a short call going whole: up to `max_size`), within
        `token_budget` (the first always goes): promoted ones, then tier by tier with tenants in turn.
        With `curve` (`curve[n] x level`: the seconds a batch of n takes; `margin`: the estimate's, 1 + its
        slack), the batch also stops growing before a size that would make one of its members miss its
        due (deadline or objective) when the smaller batch would not (see `BatchFilling`).
        `short_first`: the batch begins with the oldest short call here, whole, after any promoted
        request (`_take_short_call`).

        Requests whose deadline passed are dropped, never run (their deadline timer answers 504).
        """
        batch = BatchFilling(limit, token_budget, now, curve, level, margin, max_size)
        self._fill(batch, now, short_first and self.has_calls())
        if not self.live:  # (what the due heap holds is spent: free it now, not at the next arrival)
            self._latest_due, self._due_heap = -math.inf, None
        return batch.taken

    def _fill(self, batch: BatchFilling, now: float, short_first: bool) -> None:
        if self._promoting:
            self._take_promoted(batch, now)
        if short_first:  # (after the starvation guard's promoted requests)
            self._take_short_call(batch, now)
        for tier in self._tiers:
            if tier.live and len(tier.turns) == 1 and not tier.calls:
                self._take_fifo(tier, now, batch)
            while tier.live and batch.open:
                tenant = tier.turns[0]
                head = tier.head(tenant)
                if head is None:
                    tier.turns.popleft()
                    del tier.tenants[tenant]
                    continue
                front = tier.tenants[tenant][0]  # (`head`'s entry: a call's, or `head` itself)
                short = front.__class__ is CallInputs and front.short  # (an input of a call going whole)
                if not batch.fits(head, short):
                    return
                tier.pop(tenant)
                tier.turns.rotate(-1)
                if self._claim(tier, head, now, batch) and short and len(tier.turns) == 1:
                    batch.carries_short_call()  # (one tenant's calls only: other tenants' turns share the batch as before)
            if not batch.open:
                break

    def _take_short_call(self, batch: BatchFilling, now: float) -> None:
        """Begin the batch with the oldest short call of the highest tier waiting (its inputs here, whole),
        wherever its turn stands: in turn order a large call's last few inputs (few enough to go whole)
        could come first and fill the batch, and the short call waited for one more (S15 on a CPU: one
        more batch of ~0.23 s in two of its three slowest calls, traced, even in batches the rule sent
        before the oldest bucket for it). The batcher asks for it within the rule's budget for short
        calls going first (`policy`, rule 3)."""
        for tier in self._tiers:
            if not tier.live:
                continue
            tenant, oldest = tier.oldest_short_call()
            if oldest is None:
                return
            while batch.open and (head := oldest.head()) is not None:
                if not batch.fits(head, short_call=True):
                    return
                oldest.items.popleft()
                if self._claim(tier, head, now, batch):  # (whole, whoever else waits; the growth past it bounded
                    batch.carries_short_call(bound_growth=len(tier.turns) == 1)  # among one tenant's calls only)
            if not oldest.items:  # (spent: out of its tenant's queue now, not at its turn; see `TierQueue.drop`)
                tier.drop(tenant, oldest)
            return

    def _take_fifo(self, tier: TierQueue, now: float, batch: BatchFilling) -> None:
        """`take` from a tier with one tenant waiting: its FIFO in order, the counts settled once at the
        end. A fast path, measured: turn-taking and per-request accounting made a saturated worker's gap
        between batches of 100 three times as long (S2, 10 ms batches: 0.2 -> 0.6 ms)."""
        tenant = tier.turns[0]
        items = cast("deque[PendingRequest]", tier.tenants[tenant])  # (no calls in the tier: requests only)
        left = tokens = 0
        while items and batch.open:
            request = items[0]
            if request.state is not _QUEUED:
                items.popleft()  # a tombstone
                continue
            if not batch.fits(request):
                break
            items.popleft()
            left += 1
            tokens += tokens_of(request)
            into_batch(request, now, batch)
        tier.live -= left
        self.live -= left
        self.tokens -= tokens
        held = tier.tenant_live.get(tenant, 0) - left
        if held > 0:
            tier.tenant_live[tenant] = held
        else:
            tier.tenant_live.pop(tenant, None)

    def _take_promoted(self, batch: BatchFilling, now: float) -> None:
        for tier in self._tiers[1:]:  # the top tier needs no promotion
            if tier.promote_after_s is None or not tier.live:
                continue
            cutoff = now - tier.promote_after_s
            for tenant in list(tier.turns):
                while batch.open:
                    head = tier.head(tenant)
                    if head is None or head.enqueued_at > cutoff or not batch.fits(head):
                        break
                    tier.pop(tenant)
                    self._claim(tier, head, now, batch)

    def _claim(self, tier: TierQueue, request: PendingRequest, now: float, batch: BatchFilling) -> bool:
        """Take `request` out of the queue, into `batch` unless its deadline passed (False: it did)."""
        self._left(tier, request)
        return into_batch(request, now, batch)

    def drain(self) -> Iterator[PendingRequest]:
        """Remove and yield every live request (shutdown, breaker)."""
        for tier in self._tiers:
            for request in list(tier.each()):
                if request.state is _QUEUED:
                    request.state = RequestState.CANCELLED
                    self._left(tier, request)
                    yield request
            tier.tenants.clear()
            tier.turns.clear()
            tier.calls.clear()


def into_batch(request: PendingRequest, now: float, batch: BatchFilling) -> bool:
    """The one rule of taking a request off the queue: into `batch`, unless its deadline passed (then it
    is expired, never run: its deadline timer answers 504). False: it had."""
    if request.deadline <= now:
        request.state = RequestState.EXPIRED
        return False
    request.state = RequestState.TAKEN
    batch.add(request)
    return True
