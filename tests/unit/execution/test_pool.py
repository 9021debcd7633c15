"""What the worker pool knows and does without running a thread: when a worker is next free, how busy each
was, and what a worker dying again soon after its slot's last death does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pytest import approx

from inferd.execution.hang_limit import HangLimit
from inferd.execution.pool import WorkerPool
from inferd.execution.worker import Worker
from inferd.messages import Batch

from ...helpers import FakeClock


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


def test_a_replacement_dying_within_a_minute_of_its_start_backs_off_and_gives_up_what_it_held():
    clock = FakeClock(0.0)
    requeued: list[Batch] = []
    lost: list[tuple[list[Batch], float]] = []
    loop = asyncio.new_event_loop()
    pool = WorkerPool(name="m", devices=["cpu"], build=lambda d: None, warmup_inputs=[], next_batch=lambda f, t: None,  # type: ignore[arg-type,return-value]
                      loop=loop, hang_limit=HangLimit(1.0), on_batch_done=print, on_requeue=requeued.append,
                      on_ready=print, on_lost=lambda batches, delay: lost.append((batches, delay)), clock=clock)
    started: list[tuple[str, float]] = []
    new_worker = pool._new_worker

    def unstarted(name: str, device: str) -> Worker:  # (a replacement whose thread never runs)
        worker = new_worker(name, device)
        worker.start = lambda: started.append((worker.name, clock.now))  # type: ignore[method-assign]
        return worker

    pool._new_worker = unstarted  # type: ignore[method-assign]

    def die(after_s: float) -> Batch:
        clock.advance(after_s)
        worker = pool.workers[0]
        worker.ready = True
        batch = Batch(len(started), [], "full", clock.now)
        pool._worker_died(worker, batch, RuntimeError("died taking a batch"))
        return batch

    def wait_out_the_back_off() -> float:
        (timer,) = pool._rebuild_timers
        delay = timer.when() - loop.time()
        timer.cancel()
        pool._rebuild_timers.clear()
        clock.advance(delay)
        pool._replace(pool.workers[0])  # (what the timer does when it fires)
        return round(delay)

    try:
        first = die(100.0)  # the configured worker: replaced at once, its batch runs again
        assert (requeued, lost, started, pool._rebuild_timers) == ([first], [], [("m-0.1", 100.0)], set())
        delays = []
        for _ in range(3):  # each replacement dies at once: what it held fails, the next one waits longer
            batch = die(0.5)
            assert lost[-1][0] == [batch] and batch.abandoned and pool.healthy == 0 and len(pool._rebuild_timers) == 1
            delays.append(wait_out_the_back_off())
        assert delays == [1, 2, 4] and [delay for _, delay in lost] == [1.0, 2.0, 4.0]
        assert requeued == [first] and [name for name, _ in started] == ["m-0.1", "m-0.2", "m-0.3", "m-0.4"]
        late = die(61.0)  # one that lived a minute: replaced at once again, and the count starts again
        assert requeued[-1] is late and started[-1] == ("m-0.5", clock.now)
        die(0.5)
        assert wait_out_the_back_off() == 1
        assert (pool.deaths, pool.repeated_deaths) == (6, 4)
    finally:
        loop.close()
