"""Every request a batch model admits ends exactly once, with its own answer or an error, and the model's
queues drain: random interleavings on a fake clock of single requests and short and large calls of two
tiers and three tenants, collapsed twins and cache hits (a few texts, repeated), clients going away,
deadlines passing, and a worker that takes batches, answers them, fails them or gives them back (as
the pool does for a hung or dead one). A future set twice raises; one never set is found at the end."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferd.config import ModelConfig, TierConfig
from inferd.errors import DeadlineExceeded, InferdError, InferenceFailed, ModelUnavailable, ServiceOverloaded
from inferd.messages import Batch, Client, PendingRequest, RequestState
from inferd.models.batch_model import BatchModel
from inferd.observability.metrics import RequestMetrics

from ...helpers import FakeClock
from ..scheduling.queue_checks import assert_consistent

TEXTS = [f"text {i}" for i in range(12)]  # few: identical inputs collapse, and repeats hit the cache
TIERS = (TierConfig("paid", priority=1), TierConfig("free", promote_after_ms=200))
ENDINGS = (DeadlineExceeded, InferenceFailed, ModelUnavailable, ServiceOverloaded)  # the errors a request may end with

tiers = st.sampled_from(["paid", "free"])
tenants = st.sampled_from(["acme", "anonymous", "bolt"])
timeouts = st.floats(0.05, 3.0)
actions = st.one_of(
    st.tuples(st.just("single"), st.sampled_from(TEXTS), tiers, tenants, timeouts),
    st.tuples(st.just("call"), st.lists(st.sampled_from(TEXTS), min_size=2, max_size=20), tiers, tenants, timeouts),
    st.tuples(st.just("advance"), st.floats(0.0, 0.3)),
    st.tuples(st.just("abandon"), st.integers(0, 10_000)),
    *(st.tuples(st.just("worker"), st.just(what)) for what in ("ask", "ask", "answer", "answer", "fail", "give_back")),
)


def output(text: str) -> str:
    return f"out:{text}"


class FakeWorker:
    """One executor thread's dealings with the batcher and delivery, run by hand."""

    def __init__(self, served: BatchModel, clock: FakeClock) -> None:
        self.served, self.clock = served, clock
        self.running: Batch | None = None
        self.handed: list[Batch | None] = []  # what the batcher handed its taker while it was parked
        self.parked = False
        self.finished: list[Client | None] = []

    def step(self, what: str) -> None:
        if self.running is None:
            self.ask()
        elif what == "answer":
            self.answer()
        elif what == "fail":
            self.running.error = RuntimeError("the device failed")
            self._deliver()
        elif what == "give_back":  # (the pool's `_give_up_on`: hung or dead, its batch runs again)
            self.running.abandoned = True
            self.served.delivery.requeue(self.running)
            self.running = None

    def ask(self) -> None:
        if self.parked:
            if not self.handed:
                return
            batch, self.parked = self.handed.pop(), False
        else:
            batch = self.served.batcher.next_batch(self.finished, self.handed.append)
            self.finished = []
            self.parked = batch is None
        if batch is not None:
            batch.started_at = self.clock()
            for request in batch.requests:
                request.attempts += 1
            self.running = batch

    def answer(self) -> None:
        assert self.running is not None
        self.running.outputs = [output(r.input) for r in self.running.requests]
        self._deliver()

    def _deliver(self) -> None:
        batch, self.running = self.running, None
        assert batch is not None
        batch.finished_at = self.clock()
        self.finished = batch.clients()
        self.served.delivery.batch_done(batch)


def run(steps: list[tuple[Any, ...]]) -> None:
    loop = asyncio.new_event_loop()  # (never run: futures are set on it, its timers stand for the wheel's)
    try:
        clock = FakeClock()
        config = ModelConfig(name="m", backend="inferd.backends.sim:create", max_batch_size=8, max_wait_ms=5,
                             max_queue=40, cache_bytes=1 << 20, breaker_failures=1000)
        served = BatchModel(config, loop, RequestMetrics(), tiers=TIERS, clock=clock)
        served.pool.healthy, served.pool.warmed = 1, True
        served.costs.measured([(0, 1, 0.001)])
        worker = FakeWorker(served, clock)
        admitted: list[PendingRequest] = []
        n = 0

        def advance(seconds: float) -> None:
            clock.advance(seconds)
            served.deadlines._fire()  # (the wheel's timer, due now on the fake clock)
            served.batcher.dispatch(clock())  # (the batcher coroutine, woken by its timer)

        for step in steps:
            kind = step[0]
            n += 1
            try:
                if kind == "single":
                    admitted += served.take(f"q{n}", (step[1],), step[4], step[2], step[3])
                elif kind == "call":
                    admitted += served.take(f"c{n}", tuple(step[1]), step[4], step[2], step[3])
            except InferdError:
                pass  # refused at once: nothing was admitted
            if kind == "advance":
                advance(step[1])
            elif kind == "abandon" and admitted:
                request = admitted[step[1] % len(admitted)]
                if not request.future.done():
                    served.abandon(request)
            elif kind == "worker":
                worker.step(step[1])
            for queue in served.batcher._queues.values():
                assert_consistent(queue)

        for _ in range(20_000):  # drain: the worker answers everything, the clock moving only while it waits
            if worker.running is not None:
                worker.answer()
            elif served.batcher.depth or worker.handed:
                worker.ask()
                if worker.running is None:
                    advance(0.002)
            elif all(r.future.done() for r in admitted):
                break
            else:
                advance(0.05)  # (only riders of expired leads, waiting out their own deadlines)
        for queue in served.batcher._queues.values():
            assert_consistent(queue)
            assert queue.live == 0
        assert served.batcher.depth == 0
        for request in admitted:
            future = request.future
            assert future.done(), f"{request.request_id} ({request.state.value}) was never answered"
            if future.cancelled():
                continue
            error = future.exception()
            if error is None:
                assert future.result() == output(request.raw), f"{request.request_id} got another's answer"
            else:
                assert isinstance(error, ENDINGS), repr(error)
            assert request.state is not RequestState.QUEUED
    finally:
        loop.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(actions, min_size=10, max_size=150))
def test_every_admitted_request_ends_once_with_its_own_answer_and_the_queues_drain(steps: list[tuple[Any, ...]]) -> None:
    run(steps)
