"""One tier's waiting requests in one length bucket: a queue per tenant, the tenants' turns, and inside
a tenant the turns of its multi-input calls (see `request_queue`, which keeps the counts beside them).
A call with at most `whole_call` inputs waiting goes whole in its turn (the shortest finish first: a
10-document call beside 100-document ones is one batch's work, not ten turns'); a larger one gives one
input a turn, so it is never starved (each round serves it one)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

from ..messages import PendingRequest, RequestState

_QUEUED = RequestState.QUEUED


class CallInputs:
    """The waiting inputs of one multi-input call: one entry of its tenant's queue."""

    __slots__ = ("call_id", "items", "live", "short")

    def __init__(self, call_id: str, short: bool) -> None:
        self.call_id = call_id
        self.short = short  # a call of at most `whole_call` inputs in all (in every bucket and stage)
        self.items: deque[PendingRequest] = deque()
        self.live = 0  # its inputs still waiting (`items` also holds tombstones)

    def head(self) -> PendingRequest | None:
        items = self.items
        while items and items[0].state is not _QUEUED:
            items.popleft()
        return items[0] if items else None

    def newest(self) -> PendingRequest | None:
        items = self.items
        while items and items[-1].state is not _QUEUED:
            items.pop()
        return items[-1] if items else None


class TierQueue:
    __slots__ = ("name", "rank", "promote_after_s", "whole_call", "tenants", "turns", "calls", "live", "tenant_live")

    def __init__(self, name: str, rank: int, promote_after_s: float | None, whole_call: int = 1) -> None:
        self.name = name
        self.whole_call = whole_call  # a call with at most this many inputs waiting goes whole in its turn
        self.rank = rank
        self.promote_after_s = promote_after_s
        self.tenants: dict[str, deque[PendingRequest | CallInputs]] = {}  # a call's entry is in its tenant's deque
        self.turns: deque[str] = deque()  # tenants with (possibly) waiting requests, in turn order
        # (tenant, call) -> its entry, until it is spent; every entry in a tenant's queue is mapped here
        self.calls: dict[tuple[str, str], CallInputs] = {}
        self.live = 0
        self.tenant_live: dict[str, int] = {}  # waiting requests per tenant

    def head(self, tenant: str) -> PendingRequest | None:
        """The tenant's next request to serve (a tombstone or a spent call at the front is dropped)."""
        items = self.tenants[tenant]
        while items:
            first = items[0]
            if isinstance(first, CallInputs):
                request = first.head()
                if request is not None:
                    return request
                self.forget(tenant, first)
            elif first.state is _QUEUED:
                return first
            items.popleft()
        return None

    def pop(self, tenant: str) -> PendingRequest:
        """Take the request `head(tenant)` returned; a call with inputs left stays at the front while it
        has at most `whole_call` waiting (it goes whole), else goes to the end of the tenant's queue (its
        next input waits for the tenant's other calls' turns)."""
        items = self.tenants[tenant]
        first = items.popleft()
        if not isinstance(first, CallInputs):
            return first
        request = first.items.popleft()
        if first.items:
            if first.live <= self.whole_call:  # (`live` still counts the input taken: what its turn began with)
                items.appendleft(first)
            else:
                items.append(first)
        else:
            del self.calls[(tenant, first.call_id)]
        return request

    def forget(self, tenant: str, entry: CallInputs) -> None:
        """`entry` is spent: its call is no longer mapped to it (unless a later input of the call, come
        after it was taken whole out of turn, already made a new entry)."""
        key = (tenant, entry.call_id)
        if self.calls.get(key) is entry:
            del self.calls[key]

    def drop(self, tenant: str, entry: CallInputs) -> None:
        """`entry` was spent out of turn (wherever it stood in its tenant's queue): unmapped and out of the
        queue now, so every entry a queue holds stays mapped in `calls`, and a tier without calls holds
        requests only (what `RequestQueue._take_fifo` reads). Linear in the tenant's queue, once a batch."""
        self.forget(tenant, entry)
        items = self.tenants[tenant]
        for i, item in enumerate(items):
            if item is entry:
                del items[i]
                return

    def newest(self, tenant: str) -> PendingRequest | None:
        """The request the tenant's turn order reaches last (a spent call at the back is dropped)."""
        items = self.tenants.get(tenant)
        while items:
            last = items[-1]
            if isinstance(last, CallInputs):
                request = last.newest()
                if request is not None:
                    return request
                self.forget(tenant, last)
            elif last.state is _QUEUED:
                return last
            items.pop()
        return None

    def own_ahead(self, tenant: str, call_id: str | None) -> int:
        """The tenant's waiting requests a new one (an input of call `call_id`, or a call of its own) would be
        served after. A large call's entry gives one input a turn, so its j-th waiting input comes in the
        j-th round of the tenant's entries: after every single request, its call's j - 1 earlier inputs,
        and at most j inputs of each other large call (its inputs past j come later); an input of a call
        going whole comes in the call's first turn (j = 1). A call going whole counts whole (ahead or
        behind in the round: the safe side)."""
        mine = self.tenant_live.get(tenant, 0)
        if not self.calls:
            return mine
        own = self.calls.get((tenant, call_id)) if call_id is not None else None
        waiting = own.live if own is not None else 0
        j = 1 if waiting + 1 <= self.whole_call else waiting + 1
        whole = self.whole_call
        return mine - sum(entry.live - j for (who, _), entry in self.calls.items()
                          if who == tenant and entry is not own and entry.live > j and entry.live > whole)

    def short_at(self, oldest: PendingRequest) -> float:
        """When the oldest short call here (a single request, or a call of at most `whole_call` inputs in
        all) was queued, `oldest` being the tier's oldest head; inf: every waiting request is part of a
        large call. Without calls every request is a single one: `oldest`'s time, at no cost."""
        if not self.calls:
            return oldest.enqueued_at
        short, in_calls = math.inf, 0
        for entry in self.calls.values():
            in_calls += entry.live
            if entry.short and entry.live and (head := entry.head()) is not None:
                short = min(short, head.enqueued_at)
        if in_calls < self.live:  # single requests wait too: the oldest head stands for them (close enough)
            short = min(short, oldest.enqueued_at)
        return short

    def oldest_short_call(self) -> tuple[str, CallInputs | None]:
        """(tenant, entry) of the short call here whose next input waited longest; ("", None): none."""
        oldest: tuple[str, CallInputs | None] = ("", None)
        oldest_at = math.inf
        for (tenant, _), entry in self.calls.items():
            if entry.short and entry.live and (head := entry.head()) is not None and head.enqueued_at < oldest_at:
                oldest, oldest_at = (tenant, entry), head.enqueued_at
        return oldest

    def unlink(self, request: PendingRequest) -> None:
        """Take a queued `request` out of wherever it sits (linear: only for the rare promotion)."""
        entry = self.calls.get((request.tenant, request.call_id)) if request.call_id is not None else None
        if entry is not None and request in entry.items:
            entry.items.remove(request)
        else:
            self.tenants[request.tenant].remove(request)

    def each(self) -> Iterator[PendingRequest]:
        """Every request in the tier's queues, tombstones included."""
        for items in self.tenants.values():
            for entry in items:
                if isinstance(entry, CallInputs):
                    yield from entry.items
                else:
                    yield entry

    def heads(self) -> list[PendingRequest]:
        """Each tenant's next request (a tenant with none left is taken out of the turns). A list: read
        several times per request, mostly of one tenant, where a generator costs more than the work."""
        turns = self.turns
        if len(turns) == 1:
            tenant = turns[0]
            head = self.head(tenant)
            if head is not None:
                return [head]
            turns.clear()
            del self.tenants[tenant]
            return []
        heads = []
        for tenant in list(turns):
            head = self.head(tenant)
            if head is None:
                turns.remove(tenant)
                del self.tenants[tenant]
            else:
                heads.append(head)
        return heads
