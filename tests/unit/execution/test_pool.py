"""What the worker pool knows without running a thread: when a worker is next free, how busy each was."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pytest import approx

from inferd.execution.hang_limit import HangLimit
from inferd.execution.pool import WorkerPool


def pool_of(*workers: SimpleNamespace) -> WorkerPool:
    pool = WorkerPool(name="m", devices=[], build=lambda d: None, warmup_inputs=[], next_batch=lambda f, t: None,  # type: ignore[arg-type,return-value]
                      loop=asyncio.new_event_loop(), hang_limit=HangLimit(1.0), on_batch_done=print,
                      on_requeue=print, on_ready=print)
    pool.loop.close()
    pool.workers = list(workers)  # type: ignore[arg-type]
    return pool


def worker(name: str, *, healthy: bool = True, started_at: float | None = None, busy_s: float = 0.0) -> SimpleNamespace:
    current = None if started_at is None else SimpleNamespace(started_at=started_at, formed_at=started_at, requests=[1, 2], size=2)
    w = SimpleNamespace(name=name, healthy=healthy, current=current, behind=None, busy_s=busy_s)
    w.busy_total_s = lambda now: w.busy_s + (now - w.current.started_at if w.current is not None else 0.0)
    return w


def test_the_first_free_worker_is_the_one_with_the_least_time_left():
    assert pool_of(worker("a", started_at=10.0), worker("b", started_at=10.04)).first_free_s(10.05, lambda batch: 0.1) == approx(0.05)
    assert pool_of(worker("a", started_at=10.0), worker("b")).first_free_s(10.05, lambda batch: 0.1) == 0.0  # b is free
    assert pool_of(worker("a", started_at=9.0)).first_free_s(10.0, lambda batch: 0.1) == 0.0  # overdue: any moment now
    assert pool_of(worker("a", started_at=10.0), worker("dead", healthy=False)).first_free_s(10.0, lambda batch: 0.1) == approx(0.1)
    pipelined = worker("p", started_at=10.0)
    pipelined.behind = SimpleNamespace(started_at=0.0, formed_at=10.01, requests=[1], size=1)  # launched behind it
    pool = pool_of(pipelined)
    assert pool.first_free_s(10.05, lambda batch: 0.1) == approx(0.15)  # free once both have run
    assert pool.running() == [pipelined.current, pipelined.behind]


def test_the_busy_ratio_is_the_share_of_the_window_spent_in_calls():
    w = worker("a", busy_s=0.0)
    pool = pool_of(w)
    pool.sample_busy(0.0)
    w.busy_s = 3.0
    assert pool.busy_ratio(w, 10.0) == approx(0.3)
    w.current = SimpleNamespace(started_at=9.0, requests=[1, 2, 3], size=3)
    assert pool.busy_ratio(w, 10.0) == approx(0.4)  # the running call counts too
    assert [(s.name, s.running_requests) for s in pool.snapshot(10.0)] == [("a", 3)]
