"""A batch model's face without workers: a call's inputs taken all or none, shared work answered without
queueing, and what makes it unavailable."""

from __future__ import annotations

import asyncio

import pytest

from inferd.config import ModelConfig
from inferd.errors import ModelUnavailable, NotReady, ServiceOverloaded
from inferd.messages import RequestState
from inferd.models.batch_model import BatchModel
from inferd.observability.metrics import RequestMetrics


def model(**kw) -> BatchModel:  # type: ignore[no-untyped-def]
    """A model whose (never started) worker counts as healthy, with 1 ms batches: nothing is refused
    for time."""
    config = ModelConfig(name="m", backend="inferd.backends.sim:create", max_wait_ms=0, **kw)
    served = BatchModel(config, asyncio.get_running_loop(), RequestMetrics())
    served.pool.healthy = 1
    served.costs.measured([(0, 1, 0.001)])
    return served


async def test_a_call_of_several_inputs_is_taken_all_or_none():
    served = model(max_queue=4)
    first = served.take("a", ("x", "y"), 5.0, "default", "t")
    assert [r.request_id for r in first] == ["a.0", "a.1"] and served.batcher.depth == 2
    with pytest.raises(ServiceOverloaded) as refused:
        served.take("b", ("p", "q", "r"), 5.0, "default", "t")  # three more do not fit in four
    assert refused.value.reason == "queue_full" and served.batcher.depth == 2


async def test_inputs_in_flight_ride_on_them_and_a_refused_call_withdraws_what_it_had_taken():
    served = model(max_queue=3)
    lead = served.take("a", ("same",), 5.0, "default", "t")[0]
    call = served.take("b", ("same", "new", "new"), 5.0, "default", "t")
    assert [r.state for r in call] == [RequestState.ATTACHED, RequestState.QUEUED, RequestState.ATTACHED]
    assert call[0].lead is lead and call[2].lead is call[1] and served.batcher.depth == 2  # one copy of each
    with pytest.raises(ServiceOverloaded):
        served.take("c", ("same", "x", "y"), 5.0, "default", "t")  # two fresh ones, room for one
    assert served.batcher.depth == 2 and lead.riders is not None
    assert [r.future.cancelled() for r in lead.riders] == [False, True]  # the refused call's rider went too


async def test_each_input_of_a_call_asks_the_cache_once():
    served = model(cache_bytes=1 << 20)
    served.take("a", ("x", "y", "x"), 5.0, "default", "t")
    assert served.shared.cache.misses == 3 and served.shared.cache.hits == 0  # (not 5: a second look is no miss)


async def test_a_model_is_unavailable_while_warming_up_and_while_its_breaker_is_open():
    served = model(breaker_failures=1, breaker_cooldown_ms=5000)
    assert isinstance(served.unavailable(0.0), NotReady)  # its worker never warmed up
    served.pool.warmed = True
    assert served.unavailable(0.0) is None
    served.breaker.record(False, 100.0)
    refusal = served.unavailable(100.1)
    assert isinstance(refusal, ModelUnavailable) and refusal.reason == "breaker_open" and refusal.retry_after_ms >= 4800


async def test_what_a_worker_dying_again_held_fails_at_once_and_with_no_worker_left_what_waits_too():
    served = model()
    held = served.take("held", ("a", "b"), 5.0, "default", "t")
    batch = served.batcher.next_batch((), lambda b: None)
    assert batch is not None and batch.requests == held
    waiting = served.take("waiting", ("c",), 5.0, "default", "t")[0]
    served.delivery.lost([batch], 2.0)  # another worker is still healthy: what waits stays
    for request in held:
        error = request.future.exception()
        assert isinstance(error, ModelUnavailable) and error.reason == "worker_died" and error.retry_after_ms == 2000
    assert not waiting.future.done() and served.batcher.depth == 1
    served.pool.healthy = 0
    served.delivery.lost([], 4.0)  # none left: nothing will take it for seconds
    error = waiting.future.exception()
    assert isinstance(error, ModelUnavailable) and error.reason == "worker_died" and served.batcher.depth == 0
