"""The earliest due among one bucket's waiting requests: what the deadline trigger reads.

While requests join in the order of their dues (one timeout and one objective for all: the usual case),
each tenant's head and each multi-input call's first waiting input is due no later than anything behind
it, and those heads give the earliest due. A request due before one already waiting (a client's
deadline tighter than the objective, a request promoted to another tier, a batch put back) breaks that
order: from then until the bucket is empty again, every request joins a heap by due as well, and the
tombstones are dropped as they reach its top. Reading the heads alone, a tenant's tight request queued
behind its own earlier requests waited out their linger and expired in the queue.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable

from ..messages import PendingRequest, RequestState

_QUEUED = RequestState.QUEUED


class DueHeap:
    """Every waiting request of a bucket by due, once their dues came out of order (see the module
    docstring); rebuilt from the waiting requests when tombstones outnumber them."""

    __slots__ = ("_heap", "_joined")

    def __init__(self, waiting: Iterable[PendingRequest]) -> None:
        self._joined = itertools.count()  # (each entry's place in joining order: equal dues never compare requests)
        self._heap: list[tuple[float, int, PendingRequest]] = []
        self.rebuild(waiting)

    def rebuild(self, waiting: Iterable[PendingRequest]) -> None:
        joined = self._joined
        self._heap = [(r.due, next(joined), r) for r in waiting if r.state is _QUEUED]
        heapq.heapify(self._heap)

    def add(self, request: PendingRequest) -> None:
        heapq.heappush(self._heap, (request.due, next(self._joined), request))

    def __len__(self) -> int:
        return len(self._heap)

    def earliest(self) -> float:
        """The earliest due of a request still waiting (inf: none)."""
        heap = self._heap
        while heap and heap[0][2].state is not _QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf
