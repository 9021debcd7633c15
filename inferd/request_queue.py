"""A model's waiting requests: a deque with O(1) lazy removal.

Not thread-safe by itself: the batcher holds its lock around every call. Cancelled and expired requests
stay in the deque as tombstones until they reach the head, so a client going away costs O(1) instead of
a linear `deque.remove`; `live` counts only the requests still waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .messages import PendingRequest, RequestState

_QUEUED = RequestState.QUEUED


class RequestQueue:
    def __init__(self) -> None:
        self._items: deque[PendingRequest] = deque()
        self.live = 0

    def append(self, request: PendingRequest) -> None:
        self._items.append(request)
        self.live += 1

    def appendleft(self, requests: list[PendingRequest]) -> None:
        """Put requests back at the head, oldest first (a batch that must be retried)."""
        for request in reversed(requests):
            request.state = _QUEUED
            self._items.appendleft(request)
        self.live += len(requests)

    def remove(self, request: PendingRequest, new_state: RequestState) -> bool:
        """Take a still-queued request out; False if it already left (taken, expired, cancelled)."""
        if request.state is not _QUEUED:
            return False
        request.state = new_state
        self.live -= 1
        if len(self._items) > 64 and len(self._items) > 4 * self.live:
            self._compact()
        return True

    def oldest(self) -> PendingRequest | None:
        items = self._items
        while items and items[0].state is not _QUEUED:
            items.popleft()
        return items[0] if items else None

    def take(self, limit: int, now: float) -> list[PendingRequest]:
        """Pop up to `limit` live requests, oldest first; those whose deadline passed are dropped, never run."""
        taken: list[PendingRequest] = []
        items = self._items
        while items and len(taken) < limit:
            request = items.popleft()
            if request.state is not _QUEUED:
                continue
            self.live -= 1
            if request.deadline <= now:
                request.state = RequestState.EXPIRED  # its deadline timer answers 504
                continue
            request.state = RequestState.TAKEN
            taken.append(request)
        return taken

    def drain(self) -> Iterator[PendingRequest]:
        """Remove and yield every live request (shutdown)."""
        while self._items:
            request = self._items.popleft()
            if request.state is _QUEUED:
                request.state = RequestState.CANCELLED
                self.live -= 1
                yield request

    def _compact(self) -> None:
        self._items = deque(r for r in self._items if r.state is _QUEUED)
