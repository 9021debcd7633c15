"""An executor thread: one per GPU, running one backend call at a time.

A worker builds its own model in its own thread (a factory gets the worker's device), warms it up, then
loops: ask for the next batch (`next_batch`: pull-based, a free worker asks), call the backend, check the
output list against the input list, and pass the finished batch to the event loop with one
`call_soon_threadsafe` per batch. When no batch is due it parks: it leaves a taker with `next_batch` and
waits for a batch to be handed to it. Futures are only touched on the loop.

A backend that splits a call in two (`launch`, then `collect`: the contract) is pipelined: while one
batch computes, the worker takes the next full batch and launches it behind it, so its host-side
preparation and copies overlap the computing one and the device never waits for the host; batches are
collected in order, one computing at a time. A partial batch still waits for a free worker, to grow.

When the backend raises for a batch, the worker bisects it (calls on each half, recursively, within a
budget of extra calls) so only the inputs that fail on their own are failed: one poison input does not
take its 99 neighbours down with it. An exception that is not an `Exception` (SystemExit and the like)
kills the worker: the loop is told, re-queues its batch and starts a replacement. A worker the watchdog
gave up on (`abandoned`) exits as soon as its call returns and delivers nothing.

Everything a worker's thread does with a batch, from taking it to handing it back (one loop for both
kinds of backend: a plain call is a launch that does nothing and a collection that calls), and the
state the pool reads from another thread (`current`, `behind`, `abandoned`), is here, where "one call
at a time per device" can be read; what it asks of a backend call beside
the call itself (its outputs checked, warm-up batches timed, a failed call bisected) is
`backend_calls`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..backends import BatchBackend, Capabilities
from ..errors import describe
from ..messages import Batch, Client, Taker
from .backend_calls import check_outputs, isolate, measure_costs
from .thread_priority import lower_this_thread

log = logging.getLogger("inferd.executor")

# (the connections of the requests just answered, taker) -> a due batch, or None: parked
NextBatch = Callable[[Sequence[Client | None], Taker | None], Batch | None]
# (taker None: a full batch or nothing, never parked: a worker asking for one to launch behind its computing one)


class Worker:
    """One executor thread and the model it built. Its own state is written by its own thread, except
    `abandoned`, which the pool sets when it gives up on it, and `current`, set by whoever hands it a
    batch while it is parked."""

    def __init__(
        self,
        *,
        name: str,
        device: str,
        build: Callable[[str], BatchBackend],
        warmup_inputs: Sequence[object],
        next_batch: NextBatch,
        loop: asyncio.AbstractEventLoop,
        on_ready: Callable[[Worker], None],
        on_failed: Callable[[Worker, BaseException], None],
        on_batch_done: Callable[[Batch], None],
        on_died: Callable[[Worker, Batch | None, BaseException], None],
        max_isolation_calls: int = 32,
        max_batch_size: int = 1,
        nice: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.device = device
        self.ready = False
        self.abandoned = False  # the watchdog gave up on it: it must never deliver again
        self.backend: BatchBackend | None = None  # what its build made (the batch function)...
        self.capabilities = Capabilities()  # ...and what that offers beside (read once, when built)
        self.busy_s = 0.0  # total time inside backend calls
        self.warmup_s = 0.0  # how long the last warm-up call took: the first estimate of a batch's time
        self.warmup_report: dict[str, Any] = {}  # what warming up did and took (GET /v1/models)
        self.measured_costs: list[tuple[int, int, float]] = []  # (bucket, size, seconds) measured at warm-up
        self.max_batch_size = max_batch_size
        self.batches = 0
        self.current: Batch | None = None  # the batch inside the backend now (or handed to it, not begun)
        self.behind: Batch | None = None  # pipelined: the batch launched behind `current`, next on the device
        self.call_started_at = 0.0  # start of the backend call in progress (the watchdog's clock)
        self.max_isolation_calls = max_isolation_calls
        self._clock = clock  # its batches' and calls' times (the pool's watchdog reads the same one; a fake one in tests)
        self._nice = nice  # levels below the loop's CPU priority its thread runs at (`thread_priority`)
        self._build = build
        self._warmup_inputs = list(warmup_inputs)
        self._next_batch = next_batch
        self._loop = loop
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._on_batch_done = on_batch_done
        self._on_died = on_died
        self._handoff: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"inferd-{name}", daemon=True)

    @property
    def healthy(self) -> bool:
        return self.ready and not self.abandoned

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def busy_total_s(self, now: float) -> float:
        """Time spent in backend calls so far, the running one included."""
        running = self.current
        return self.busy_s + (now - running.started_at if running is not None and running.started_at else 0.0)

    # ---- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        lower_this_thread(self._nice)  # (before the build: threads the backend starts inherit it)
        try:
            fn = self._build(self.device)
            offers = Capabilities.of(fn)  # (the contract, checked once: a misspelt hook fails the start)
            lower_this_thread(offers.execute_nice)  # (before the warm-up starts the backend's CPU threads)
            started = self._clock()
            if offers.warmup is not None:  # e.g. CUDA graph capture
                self.warmup_report = dict(offers.warmup() or {})
            shapes = offers.warmup_batches
            batches = shapes() if shapes is not None else [self._warmup_inputs] if self._warmup_inputs else []
            for batch in batches:  # e.g. one per length bucket: every shape is compiled before serving
                call_started = self._clock()
                check_outputs(fn(list(batch)), len(batch))
                self.warmup_s = self._clock() - call_started
            if shapes is not None or offers.cost is not None:  # what its shapes cost: the cost model's start
                self.measured_costs = measure_costs(fn, offers.cost, batches, self.max_batch_size, self._clock)
            elif batches:  # the warm-up inputs, taken as one bucket's: the first figure to learn from
                self.measured_costs = [(0, len(batches[-1]), self.warmup_s)]
            self.warmup_report["warmup_s"] = round(self._clock() - started, 3)
        except BaseException as exc:  # noqa: BLE001 - reported to the loop, the model stays not ready
            log.error("worker %s failed to start: %s", self.name, describe(exc))  # a config mistake, mostly
            log.debug("worker %s start-up failure", self.name, exc_info=True)
            self._call_loop(self._on_failed, self, exc)
            return
        self.backend, self.capabilities = fn, offers
        self.ready = True
        self._call_loop(self._on_ready, self)
        try:
            self._serve(fn, offers.launch, offers.collect)  # (`Capabilities.of`: both or neither)
        except BaseException as exc:  # noqa: BLE001 - the worker dies; the loop re-queues and replaces
            if not self.abandoned:
                log.error("worker %s died: %r", self.name, exc, exc_info=exc)  # (a replacement dying the same way backs off)
                self._call_loop(self._on_died, self, self.current, exc)  # (`behind` too: the pool hands both back)

    def _serve(self, fn: BatchBackend, launch: Callable[[list[object]], object] | None,
               collect: Callable[[object], Sequence[object]] | None) -> None:
        """Take a batch (parked when none is due), launch it, collect the oldest launched one, and so on.
        A backend without `launch`/`collect` runs its whole call as the collection, one batch in flight; one
        with them gets a full batch launched behind the computing one, two in flight (the module docstring)."""
        depth = 1 if collect is None else 2
        flight: deque[tuple[Batch, object]] = deque()  # launched, not collected: (batch, handle or the launch's error)
        finished: Sequence[Client | None] = ()
        last_end = 0.0
        while not self.abandoned:
            if len(flight) < depth:
                batch = self._next_batch(finished, self._hand_over if not flight else None)
                finished, parked_at = (), 0.0
                if batch is None and not flight:  # nothing due, nothing computing: parked until one is
                    parked_at = self._clock()
                    batch = self._handoff.get()
                    if batch is None:
                        return
                if batch is not None:
                    flight.append((batch, self._launch(batch, launch, parked_at, last_end, behind=bool(flight))))
                    if len(flight) < depth:
                        continue  # one more behind it, if a full one is due
            batch, handle = flight.popleft()
            if collect is None:
                self._execute(fn, batch)
            else:
                self._collect(fn, collect, batch, handle)
            last_end = batch.finished_at = self._clock()
            self.busy_s += last_end - batch.started_at
            self.batches += 1
            finished = batch.clients()  # (not its requests: once answered they go, `Batch.clients`)
            if flight:  # the one behind computes from now on (its launch overlapped this one)
                following = flight[0][0]
                following.started_at = last_end
                self.current, self.behind, self.call_started_at = following, None, last_end
            else:
                self.current, self.call_started_at = None, 0.0
            if self.abandoned:
                return  # the watchdog already re-queued what was in flight: its results are discarded
            if not self._call_loop(self._on_batch_done, batch):
                return

    def _launch(self, batch: Batch, launch: Callable[[list[object]], object] | None, parked_at: float, last_end: float,
                *, behind: bool) -> object:
        """Start `batch` on this worker: its timings, its attempt, and its launch when the backend has one
        (the handle `collect` takes, or the launch's error: that batch fails alone, in its turn)."""
        now = self._clock()
        batch.worker = self.name
        if parked_at:  # how long the free worker waited for this batch to fill
            batch.linger_s = max(0.0, batch.formed_at - max(parked_at, batch.requests[0].enqueued_at))
        for request in batch.requests:
            request.attempts += 1
        if behind:
            self.behind = batch  # (it starts when the one computing is collected)
        else:  # the device is free: it starts now
            batch.started_at = now
            if last_end and not parked_at:  # back to back: the turnaround since the previous call (read on the loop)
                batch.gap_s = now - last_end
            self.current, self.call_started_at = batch, now
        if launch is None:
            return None  # (its call is its collection)
        try:
            return launch([r.input for r in batch.requests])
        except Exception as exc:  # noqa: BLE001 - this batch fails alone, in its turn
            return _LaunchFailed(exc)

    def _collect(self, fn: BatchBackend, collect: Callable[[object], Sequence[object]], batch: Batch, handle: object) -> None:
        """A launched batch's outputs; a failed one is bisected with plain calls, as `_execute` does."""
        try:
            if isinstance(handle, _LaunchFailed):
                raise handle.error
            batch.outputs = check_outputs(collect(handle), len(batch.requests))
        except Exception:  # noqa: BLE001 - find out which inputs did it, the usual way
            self._execute(fn, batch)

    def _hand_over(self, batch: Batch | None) -> None:
        """The taker this worker leaves when it parks (called on another thread): the batch is its
        current one from now on, so whoever asks how soon a worker is free counts it as running."""
        if batch is not None:
            self.current = batch
        self._handoff.put(batch)

    def _call(self, fn: BatchBackend, inputs: list[object]) -> list[object]:
        self.call_started_at = self._clock()
        try:
            return check_outputs(fn(inputs), len(inputs))
        finally:
            self.call_started_at = 0.0

    def _execute(self, fn: BatchBackend, batch: Batch) -> None:
        inputs = [r.input for r in batch.requests]
        try:
            batch.outputs = self._call(fn, inputs)
            return
        except Exception as exc:  # noqa: BLE001 - the batch failed; find out which inputs did it
            if len(inputs) == 1 or self.max_isolation_calls <= 0:
                batch.error = exc
                return
            outputs: list[object] = [None] * len(inputs)
            batch.failures = isolate(lambda part: self._call(fn, part), inputs, exc, outputs, self.max_isolation_calls,
                                     lambda: self.abandoned)
            batch.outputs, batch.error = outputs, exc

    def _call_loop(self, fn: Callable[..., None], *args: object) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the loop is closed: the process is exiting
            return False


class _LaunchFailed:
    """What a launch that raised leaves in the pipeline: its batch fails in its turn, alone."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error
