"""Clients and one worker around the real `Batcher`, on a fake clock: a discrete-event simulation with
no threads and no sleeps. Closed-loop clients send again a turnaround after their answer; open-loop
arrivals come when they come. The worker asks for its next batch the moment one ends (as the executor
thread does, before the answers are out), and the batcher coroutine's part is played by calling
`dispatch` after every event and at the time it names."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from inferd.messages import Batch, Client, PendingRequest
from inferd.scheduling.batch_costs import BatchCosts
from inferd.scheduling.batcher import Batcher

from ...helpers import FakeClock


@dataclass
class Run:
    """What a run served: each request's latency (arrival to its batch's end, by the time it arrived)
    and each batch's (start, size, trigger)."""

    latencies: list[tuple[float, float]] = field(default_factory=list)
    batches: list[tuple[float, int, str]] = field(default_factory=list)

    def after(self, t: float) -> list[float]:
        return [latency for arrived, latency in self.latencies if arrived >= t]

    def p(self, q: float, since: float = 0.0) -> float:
        values = sorted(self.after(since))
        return values[min(len(values) - 1, int(q * len(values)))]

    def p50(self, since: float = 0.0) -> float:
        return statistics.median(self.after(since))


class Simulation:
    def __init__(self, *, batch_s: float, max_batch_size: int, max_wait_ms: float) -> None:
        self.clock = FakeClock(0.0)
        self.loop = asyncio.new_event_loop()  # (the batcher's wake-up event lives on it; nothing runs it)
        costs = BatchCosts(max_batch_size)
        costs.measured([(0, 1, batch_s), (0, max_batch_size, batch_s)])
        self.batch_s = batch_s
        self.batcher = Batcher(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=100_000,
                               loop=self.loop, batch_time_s=lambda: batch_s, costs=costs, clock=self.clock)
        self.run = Run()
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._next_dispatch = float("inf")
        self.on_answer: Callable[[PendingRequest, float], float | None] = lambda request, now: None
        self.connections: dict[int, Client] = {}  # each closed-loop client's connection (open-loop requests: none)

    def at(self, t: float, kind: str, data: object = None) -> None:
        heapq.heappush(self._events, (t, next(self._order), kind, data))

    def _start(self, batch: Batch | None) -> None:
        if batch is not None:
            self.run.batches.append((self.clock(), batch.size, batch.trigger))
            self.at(self.clock() + self.batch_s, "end", batch)

    def _ask(self, finished: list[Client | None]) -> None:
        self._start(self.batcher.next_batch(finished, self._start))

    def until(self, end_s: float) -> Run:
        """Run the events up to `end_s`."""
        if not self.run.batches and not self.batcher._takers:
            self._ask([])
        while self._events and self._events[0][0] <= end_s:
            t, _, kind, data = heapq.heappop(self._events)
            self.clock.now = t
            if kind == "arrive":
                client = data
                request = PendingRequest(f"r{next(self._ids)}", client, t, t + 60.0, None, due=t + 60.0,  # type: ignore[arg-type]
                                         client=self.connections.get(client))  # type: ignore[call-overload]
                self.batcher.submit(request)
            elif kind == "end":
                batch: Batch = data  # type: ignore[assignment]
                for request in batch.requests:
                    self.run.latencies.append((request.enqueued_at, t - request.enqueued_at))
                    again = self.on_answer(request, t)
                    if again is not None:
                        self.at(t + again, "arrive", request.input)
                self._ask(batch.clients())
            elif kind == "dispatch" and t < self._next_dispatch:
                continue  # (a later dispatch was asked for since)
            due_at = self.batcher.dispatch(t)
            if due_at is not None and due_at != self._next_dispatch:
                self._next_dispatch = max(due_at, t + 1e-6)
                self.at(self._next_dispatch, "dispatch")
        self.clock.now = end_s
        return self.run

    def close(self) -> None:
        self.loop.close()


def closed_loop(sim: Simulation, clients: dict[int, float], turnaround_s: Callable[[int], float]) -> None:
    """Closed-loop clients, each sending its first request at the time given and its next one
    `turnaround_s(client)` after each answer (None from it: the client has gone)."""
    for client, first_at in clients.items():
        sim.connections[client] = Client()
        sim.at(first_at, "arrive", client)
    sim.on_answer = lambda request, now: turnaround_s(request.input)  # type: ignore[arg-type]


def open_loop(sim: Simulation, rate: float, duration_s: float, seed: int = 3) -> None:
    """Poisson arrivals at `rate` a second for `duration_s`."""
    rng, t = random.Random(seed), 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        sim.at(t, "arrive", -1)


def greedy(rate: float, duration_s: float, batch_s: float, max_batch_size: int, seed: int = 3) -> Run:
    """The same arrivals served greedily: whatever waits goes when the worker frees, at once when it is
    idle (the reference of `shared/tools/batch_des.py`)."""
    rng, t, arrivals = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        arrivals.append(t)
    run, free_at, i = Run(), 0.0, 0
    while i < len(arrivals):
        start = max(free_at, arrivals[i])
        batch = [a for a in arrivals[i:i + max_batch_size] if a <= start]
        i += len(batch)
        free_at = start + batch_s
        run.batches.append((start, len(batch), "greedy"))
        run.latencies += [(a, free_at - a) for a in batch]
    return run
