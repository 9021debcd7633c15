"""A finished batch becoming answers, without workers: each request gets its own output, failures stay
with the inputs that caused them, a failing model trips its breaker, and a batch the pool gave up on
runs again within its attempts."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferd.config import ModelConfig
from inferd.errors import DeadlineExceeded, InferenceFailed, ModelUnavailable
from inferd.execution.breaker import BreakerState
from inferd.messages import Batch, RequestState
from inferd.models.batch_model import BatchModel
from inferd.observability.metrics import RequestMetrics


def model(**kw) -> BatchModel:  # type: ignore[no-untyped-def]
    """A model whose (never started) worker counts as healthy, with 1 ms batches: nothing is refused."""
    config = ModelConfig(name="m", backend="inferd.backends.sim:create", max_wait_ms=0, collapse=False, **kw)
    served = BatchModel(config, asyncio.get_running_loop(), RequestMetrics())
    served.pool.healthy = 1
    served.costs.measured([(0, 1, 0.001)])
    return served


def take(served: BatchModel, **finished) -> Batch:  # type: ignore[no-untyped-def]
    """The next batch, as a worker takes it, finished with the given fields."""
    batch = served.batcher.next_batch((), lambda b: None)
    assert batch is not None
    batch.started_at = batch.finished_at = time.monotonic()
    for name, value in finished.items():
        setattr(batch, name, value)
    return batch


async def test_each_request_gets_its_own_output_and_the_batch_is_counted():
    served = model()
    requests = [served.submit(f"r{i}", f"in{i}", 5.0) for i in range(3)]
    batch = take(served)
    batch.outputs = [r.input.upper() for r in batch.requests]
    served.delivery.batch_done(batch)
    assert [await r.future for r in requests] == ["IN0", "IN1", "IN2"]
    assert all(r.batch is batch for r in requests)  # (each answer can say which batch it rode in)
    stats = served.delivery.stats
    assert stats is served.stats and stats.batch_sizes == {3: 1} and stats.queue_wait.count == 3
    assert len(served.deadlines) == 0  # answered: no timer left to fire
    assert batch.requests == [] and batch.outputs is None  # let go of once delivered


async def test_a_batch_the_pool_gave_up_on_is_not_delivered_when_it_finally_returns():
    served = model()
    request = served.submit("r0", "late", 5.0)
    batch = take(served, outputs=["LATE"], abandoned=True)
    served.delivery.batch_done(batch)
    assert not request.future.done() and served.stats.batch_sizes == {}


async def test_isolated_failures_fail_alone_and_are_kept_as_dead_letters():
    served = model()
    poison, fine = served.submit("r0", "poison", 5.0), served.submit("r1", "fine", 5.0)
    batch = take(served, outputs=[None, "FINE"], error=ValueError("bad"), failures={0: ValueError("bad")})
    served.delivery.batch_done(batch)
    with pytest.raises(InferenceFailed, match="bad"):
        await poison.future
    assert await fine.future == "FINE"
    assert [entry["request_id"] for entry in served.dead_letters.entries()] == ["r0"]
    assert served.breaker.state is BreakerState.CLOSED  # one input's fault says nothing of the model


async def test_a_model_that_fails_everything_opens_its_breaker_and_fails_what_waits_at_once():
    served = model(breaker_failures=2)
    first = served.submit("f0", "x", 5.0)
    served.delivery.batch_done(take(served, error=RuntimeError("GPU fell off")))
    with pytest.raises(InferenceFailed, match="GPU fell off"):
        await first.future
    assert served.breaker.state is BreakerState.CLOSED
    second = served.submit("f1", "y", 5.0)
    running = take(served, error=RuntimeError("GPU fell off"))
    waiting = served.submit("w", "queued meanwhile", 5.0)
    served.delivery.batch_done(running)
    with pytest.raises(InferenceFailed, match="GPU fell off"):
        await second.future
    # the second failure opened it: the request queued meanwhile is failed now, not fed to the model
    assert served.breaker.state is BreakerState.OPEN
    assert waiting.state is not RequestState.QUEUED
    with pytest.raises(ModelUnavailable) as refused:
        await waiting.future
    assert refused.value.reason == "breaker_open" and refused.value.retry_after_ms == served.config.breaker_cooldown_ms
    assert served.dead_letters.entries() == []  # (a whole-batch failure isolates nobody)


async def test_a_given_up_batch_runs_again_within_its_attempts():
    served = model(max_batch_attempts=2)
    again, spent, gone = (served.submit(f"r{i}", f"in{i}", 5.0) for i in range(3))
    expired = served.submit("r3", "in3", 5.0)
    batch = take(served)
    spent.attempts = 2
    again.attempts = 1
    served.abandon(gone)  # its client left while the batch hung
    expired.deadline = time.monotonic() - 0.001
    expired.attempts = 2
    served.delivery.requeue(batch)
    with pytest.raises(InferenceFailed, match="gave up after 2 attempts"):
        await spent.future
    with pytest.raises(DeadlineExceeded):
        await expired.future
    assert served.batcher.depth == 1 and again.state is RequestState.QUEUED and not again.future.done()
    rerun = take(served, outputs=["IN0"])
    assert rerun.requests == [again]
    served.delivery.batch_done(rerun)
    assert await again.future == "IN0"


async def test_lateness_is_against_the_later_of_the_predicted_answer_and_the_batch_that_formed():
    """Eight requests answered by a batch of eight that ran 20 ms over its estimate. Those that expected
    a larger batch (40 ms more) came early: slack their prediction held, no lateness. Those that
    expected a batch of one (10 ms) are late by the 20 ms alone: the seven who joined them are not a
    timing error the margin covers."""
    for larger, bound_s in ((True, 0.0), (False, 0.020)):
        served = model()
        served.costs.measured([(0, 1, 0.010)])
        for _ in range(6):  # a settled shape
            served.costs.observe(0, 8, 0.040, time.monotonic())
        requests = [served.submit(f"r{i}", f"in {i}", 5.0) for i in range(8)]
        batch = take(served)
        estimate = served.forecast.settled_batch_cost_s(batch.size, batch.bucket)
        assert batch.size == 8 and estimate is not None
        start = time.monotonic()
        for request in requests:
            done = start + estimate + 0.040 if larger else start + 0.010
            request.predicted_wait, request.predicted_start, request.predicted_done = 0.0, start, done
        batch.finished_at = start + estimate + 0.020
        batch.outputs = [r.input for r in batch.requests]
        served.delivery.batch_done(batch)
        assert served.timeliness.lateness.bound_s(batch.finished_at + 1.0) == pytest.approx(bound_s, abs=0.001)
