"""The preprocessing stage: a backend's `prepare_batch` (e.g. its tokenizer) run off the event loop, on
micro-batches of arriving requests.

Why: tokenising one input at a time on the loop cost 29-61% of the loop's time on a real GPU host, while
the same tokenizer called once for many inputs costs a fraction per input and runs in native code that
releases the GIL. So the loop only appends each admitted request to a list; one thread per model takes
everything that arrived since its last call, prepares it in one call and hands the results back with
one `call_soon_threadsafe`. While the thread works, new arrivals gather for its next call, so micro-batches
grow with the load by themselves and a lone request is never held back.

A backend whose preparation costs per input and runs outside the GIL (an image decoder: ~1-3 ms an image)
asks for several threads (`prepare_threads`): what waits is then split among the idle ones, so one
thread's pace no longer caps the model (an H200 run served 335 images/s with one, its GPU 4% busy).

Where the buckets are lengths (the backend's `buckets_by_length`), the inputs of a small multi-input call
prepared together are all given its longest input's bucket: a 10-document rerank call spread over three
length buckets waited for three batches, each shared with bigger calls' inputs, where one would do. A
call of more than `together_limit` inputs keeps each input's own bucket: it takes several batches
anyway, and padding all of it would cost what the small call's few inputs do not.

What waits goes to the threads short calls first (a single input, or a call of at most `short_call`
inputs: the size that goes whole in its turn in the queue), each tenant's in arrival order otherwise: a
10-document call that arrives behind four 100-document ones is tokenised next, in a micro-batch of the
short calls' inputs alone (back in a few milliseconds, not after 200 pairs of theirs; and whole, where
its inputs can be given one bucket); the large calls' inputs go in the micro-batches after it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import PendingRequest, RequestState

log = logging.getLogger("inferd.preprocess")

PrepareBatch = Callable[[Sequence[object]], Sequence[object]]
MAX_MICRO_BATCH = 256  # a cap, so one huge burst does not delay its first requests behind its last
_GONE = (RequestState.CANCELLED, RequestState.EXPIRED)


class Preprocessor:
    """One model's preprocessing threads (one unless the backend asks for more). `put` is called on the
    event loop; `on_prepared(requests, results)` is called back on the loop with one result (or
    Exception) per request of a micro-batch, in its order (micro-batches on several threads may finish
    out of order)."""

    def __init__(
        self,
        prepare_batch: PrepareBatch,
        loop: asyncio.AbstractEventLoop,
        on_prepared: Callable[[list[PendingRequest], Sequence[object]], None],
        name: str,
        on_thread_start: Callable[[], None] | None = None,
        threads: int = 1,
        max_micro_batch: int = MAX_MICRO_BATCH,
        together_limit: int = 0,
        short_call: int = 0,
        large_micro_batch: int = MAX_MICRO_BATCH,
    ) -> None:
        if threads < 1:
            raise ValueError("a preprocessor needs at least one thread")
        self._prepare_batch = prepare_batch
        self._on_thread_start = on_thread_start  # e.g. its CPU priority lowered (`execution.thread_priority`)
        self._loop = loop
        self._on_prepared = on_prepared
        self._waiting: list[PendingRequest] = []
        self._threads = threads
        # small where an input costs milliseconds (the backend's `prepare_max_batch`: an image decoder's 8):
        # what was withdrawn meanwhile is dropped between micro-batches, and tenants' turns matter
        self._max_micro_batch = max_micro_batch
        self._together_limit = together_limit  # a call of at most this many inputs takes one bucket (0: none)
        self._short_call = short_call  # a call of at most this many inputs is prepared first (0: arrival order)
        self._large_micro_batch = large_micro_batch  # the most large calls' inputs in a micro-batch beside short calls
        self._busy = 0  # micro-batches with the threads
        self._jobs: queue.SimpleQueue[list[PendingRequest] | None] = queue.SimpleQueue()
        for i in range(threads):
            suffix = f"-{i}" if threads > 1 else ""
            threading.Thread(target=self._run, name=f"inferd-prepare-{name}{suffix}", daemon=True).start()
        self.calls = 0
        self.items = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing waits for the thread and nothing is with it."""
        return not self._busy and not self._waiting

    def put(self, request: PendingRequest) -> None:
        """Queue a request for preparation (its `raw` holds the input)."""
        self._waiting.append(request)
        if self._busy < self._threads and len(self._waiting) == 1:
            self._loop.call_soon(self._send)  # after this loop iteration: everything parsed in it goes together

    def stop(self) -> list[PendingRequest]:
        """Stop the threads; returns the requests not yet sent to them."""
        waiting, self._waiting = self._waiting, []
        for _ in range(self._threads):
            self._jobs.put(None)
        return waiting

    def _send(self) -> None:
        """What waits, split evenly among the idle threads (a micro-batch each, at most `_max_micro_batch`;
        60 large images in one once held the only decoding thread ~36 s after their client had gone):
        what nobody waits for any more (its client gone, its deadline passed) is dropped, never prepared,
        and the tenants take turns, so one tenant's call of many inputs does not hold another's single
        one behind all of it."""
        waiting = [r for r in self._waiting if r.state not in _GONE]
        short, cap = 0, self._max_micro_batch
        if self._short_call:
            waiting, short, large = _short_first(waiting, self._short_call)
            if large:  # (a short call arriving meanwhile waits for at most this many of theirs)
                cap = min(cap, self._large_micro_batch)
        if len({r.tenant for r in waiting}) > 1:
            waiting = _in_turns(waiting[:short]) + _in_turns(waiting[short:])
        self._waiting = waiting
        while self._busy < self._threads and self._waiting:
            size = min(cap, -(-len(self._waiting) // (self._threads - self._busy)))
            if 0 < short < size:  # short calls' inputs go alone: back without waiting for a large call's
                size = short
            short = max(0, short - size)
            batch = self._waiting[:size]
            del self._waiting[:size]
            self._busy += 1
            self._jobs.put(batch)

    def _run(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start()
        while (batch := self._jobs.get()) is not None:
            try:
                results = self._prepare_batch([r.raw for r in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"prepare_batch returned {len(results)} results for {len(batch)} inputs")
            except Exception as exc:  # noqa: BLE001 - the whole call failed: every input in it is refused
                log.exception("prepare_batch failed for %d inputs", len(batch))
                results = [exc] * len(batch)
            try:
                self._loop.call_soon_threadsafe(self._done, batch, results)
            except RuntimeError:  # the loop is closed: the process is exiting
                return

    def _done(self, batch: list[PendingRequest], results: Sequence[object]) -> None:
        self._busy -= 1
        self.calls += 1
        self.items += len(batch)
        if self._waiting:
            self._send()  # before the callback: the thread starts on the next micro-batch at once
        if self._together_limit:
            results = calls_together(batch, results, self._together_limit)
        self._on_prepared(batch, results)


def calls_together(batch: list[PendingRequest], results: Sequence[Any], limit: int) -> Sequence[Any]:
    """`results` with the inputs of each multi-input call of at most `limit` inputs here in the bucket of
    its longest (the highest bucket among them; an input that failed stays failed). (A short call's
    inputs go to the thread together: see `_send`.)"""
    calls: dict[str, list[int]] = {}
    for i, request in enumerate(batch):
        if request.call_id is not None and request.call_size <= limit:
            calls.setdefault(request.call_id, []).append(i)
    if not calls:
        return results
    together = list(results)
    for indexes in calls.values():
        if len(indexes) < 2:
            continue
        prepared = [i for i in indexes if not isinstance(together[i], BaseException)]
        if prepared:
            top = max(together[i][1] for i in prepared)
            for i in prepared:
                one = together[i]
                if one[1] != top:
                    together[i] = (one[0], top, *one[2:])
    return together


def _short_first(requests: list[PendingRequest], short_call: int) -> tuple[list[PendingRequest], int, bool]:
    """`requests` with the inputs of short calls (of at most `short_call` inputs in all; single ones
    included) ahead of large calls' inputs, each
    group in its own order; how many are short calls' (0 when they are all of one kind: the order stands);
    whether a large call's are among them."""
    short = [r for r in requests if r.call_size <= short_call]
    if len(short) == len(requests):
        return requests, 0, False
    if not short:
        return requests, 0, True
    return short + [r for r in requests if r.call_size > short_call], len(short), True


def _in_turns(requests: list[PendingRequest]) -> list[PendingRequest]:
    """The requests with their tenants taking turns, each tenant's in its own order."""
    by_tenant: dict[str, deque[PendingRequest]] = {}
    for request in requests:
        by_tenant.setdefault(request.tenant, deque()).append(request)
    turns: list[PendingRequest] = []
    while by_tenant:
        for tenant in list(by_tenant):
            mine = by_tenant[tenant]
            turns.append(mine.popleft())
            if not mine:
                del by_tenant[tenant]
    return turns
