"""The executor thread's loop on a fake clock: what it times (the linger of a batch it waited for, the
gap between calls back to back, its busy time), what it counts, how it bisects a failed call, what an
abandoned worker delivers (nothing), and the order in which a pipelined backend's batches are launched
and collected. The loop runs on the test's thread (`Worker._run`), against scripted `next_batch`es and
a loop that delivers at once; only the parked hand-over runs on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from pytest import approx

from inferd.execution.worker import Worker
from inferd.messages import Batch, Client, PendingRequest, Taker

from ...helpers import FakeClock

BATCH_S = 0.1  # what one backend call takes on the fake clock


class DeliveringLoop:
    """The two things a worker asks of the event loop: run this (at once, here), or refuse once closed."""

    def __init__(self) -> None:
        self.closed = False

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        if self.closed:
            raise RuntimeError("loop is closed")
        fn(*args)


class Script:
    """`next_batch` from a list: each entry is a batch to return or None (nothing due); once the list is
    out, a worker that asks with a taker is handed None (stop). It records what each ask was given."""

    def __init__(self, clock: FakeClock, *entries: Batch | None, gap_s: float = 0.0) -> None:
        self.clock, self.entries, self.gap_s = clock, list(entries), gap_s
        self.asks: list[tuple[list[Client | None], bool]] = []  # (the connections just answered, a taker given)

    def __call__(self, finished: Sequence[Client | None], taker: Taker | None) -> Batch | None:
        self.asks.append((list(finished), taker is not None))
        self.clock.advance(self.gap_s)
        if self.entries:
            return self.entries.pop(0)
        if taker is not None:
            taker(None)
        return None


class Backend:
    """A batch function that takes `BATCH_S` on the clock and fails any call holding "poison"."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[list[str]] = []

    def __call__(self, inputs: list[str]) -> list[str]:
        self.calls.append(list(inputs))
        self.clock.advance(BATCH_S)
        if "poison" in inputs:
            raise ValueError("poison")
        return [s.upper() for s in inputs]


class Pipelined(Backend):
    """The same function split in launch and collect, recording their order."""

    def __init__(self, clock: FakeClock, fail_launch_of: str = "") -> None:
        super().__init__(clock)
        self.order: list[str] = []
        self.fail_launch_of = fail_launch_of

    def launch(self, inputs: list[str]) -> list[str]:
        self.order.append(f"launch {inputs[0]}")
        if inputs[0] == self.fail_launch_of:
            raise RuntimeError("out of pinned memory")
        return inputs

    def collect(self, handle: list[str]) -> list[str]:
        self.order.append(f"collect {handle[0]}")
        self.clock.advance(BATCH_S)
        return [s.upper() for s in handle]


def batch(clock: FakeClock, *inputs: str, waited_s: float = 0.0) -> Batch:
    requests = [PendingRequest(f"r-{s}", s, clock() - waited_s, clock() + 10.0, None, client=f"c-{s}")  # type: ignore[arg-type]
                for s in inputs]
    return Batch(0, requests, "full", clock())


def worker_of(clock: FakeClock, backend: Any, next_batch: Callable[..., Batch | None],
              loop: DeliveringLoop | None = None, **options: Any) -> tuple[Worker, list[Batch], list[Any]]:
    done: list[Batch] = []
    died: list[Any] = []
    worker = Worker(name="m-0", device="cpu", build=lambda device: backend, warmup_inputs=[], next_batch=next_batch,
                    loop=loop or DeliveringLoop(), on_ready=lambda w: None, on_failed=lambda w, e: died.append(e),  # type: ignore[arg-type]
                    on_batch_done=done.append, on_died=lambda w, b, e: died.append((b, e)), clock=clock, **options)
    return worker, done, died


def test_back_to_back_batches_are_timed_counted_and_tell_the_batcher_who_was_answered():
    clock = FakeClock(100.0)
    first, second = batch(clock, "a", "b"), batch(clock, "c")
    script = Script(clock, first, second, gap_s=0.003)
    worker, done, died = worker_of(clock, Backend(clock), script)
    worker._run()
    assert done == [first, second] and not died
    assert [b.outputs for b in done] == [["A", "B"], ["C"]]
    assert second.started_at - first.finished_at == approx(0.003) == second.gap_s  # the turnaround between calls
    assert first.gap_s is None  # (its worker's first call)
    assert first.finished_at - first.started_at == approx(BATCH_S)
    assert worker.busy_s == approx(2 * BATCH_S) and worker.batches == 2
    assert [r.attempts for b in done for r in b.requests] == [1, 1, 1]
    assert [finished for finished, _ in script.asks] == [[], ["c-a", "c-b"], ["c-c"]]
    assert worker.current is None and worker.call_started_at == 0.0


def test_a_batch_handed_to_a_parked_worker_is_timed_from_when_it_parked():
    clock = FakeClock(100.0)
    parked = threading.Event()
    takers: list[Taker] = []

    def next_batch(finished: Sequence[Client | None], taker: Taker | None) -> Batch | None:
        assert taker is not None
        takers.append(taker)
        parked.set()
        return None

    worker, done, died = worker_of(clock, Backend(clock), next_batch)
    thread = threading.Thread(target=worker._run)
    thread.start()
    assert parked.wait(5.0)
    parked.clear()
    late = batch(clock, "x", waited_s=0.005)  # queued 5 ms before the worker parked...
    clock.advance(0.02)  # ...and formed 20 ms after
    late.formed_at = clock()
    takers[-1](late)
    assert parked.wait(5.0)  # it asked again once it was done
    takers[-1](None)
    thread.join(5.0)
    assert done == [late] and not died
    assert late.linger_s == approx(0.02)  # from the park, not from the request's arrival
    assert late.gap_s is None and late.started_at == approx(late.formed_at)


def test_a_failed_call_is_bisected_so_only_the_poison_input_fails():
    clock = FakeClock(100.0)
    mixed = batch(clock, "a", "b", "poison", "d")
    backend = Backend(clock)
    worker, done, _ = worker_of(clock, backend, Script(clock, mixed), max_isolation_calls=8)
    worker._run()
    assert done == [mixed]
    assert mixed.outputs == ["A", "B", None, "D"]
    assert list(mixed.failures or {}) == [2] and isinstance(mixed.error, ValueError)
    assert backend.calls == [["a", "b", "poison", "d"], ["a", "b"], ["poison", "d"], ["poison"], ["d"]]
    assert mixed.finished_at - mixed.started_at == approx(5 * BATCH_S)  # every call of the bisection is its time


def test_without_an_isolation_budget_the_whole_batch_fails():
    clock = FakeClock(100.0)
    mixed = batch(clock, "a", "poison")
    worker, done, _ = worker_of(clock, Backend(clock), Script(clock, mixed), max_isolation_calls=0)
    worker._run()
    assert done == [mixed] and isinstance(mixed.error, ValueError) and mixed.outputs is None


def test_the_watchdog_reads_when_the_running_call_started_and_an_abandoned_worker_delivers_nothing():
    clock = FakeClock(100.0)
    seen: list[tuple[float, Batch | None]] = []

    class Hangs(Backend):
        def __call__(self, inputs: list[str]) -> list[str]:
            seen.append((worker.call_started_at, worker.current))
            worker.abandoned = True  # (what the pool's watchdog does when the call runs past its limit)
            return super().__call__(inputs)

    stuck = batch(clock, "a")
    worker, done, died = worker_of(clock, Hangs(clock), Script(clock, stuck, batch(clock, "never")))
    worker._run()
    assert seen == [(100.0, stuck)]
    assert done == [] and not died  # its batch was re-queued by the pool: nothing delivered, nothing taken after


def test_an_exception_that_is_not_an_error_kills_the_worker_with_its_batch():
    clock = FakeClock(100.0)

    class Exits(Backend):
        def __call__(self, inputs: list[str]) -> list[str]:
            raise SystemExit(3)

    held = batch(clock, "a")
    worker, done, died = worker_of(clock, Exits(clock), Script(clock, held))
    worker._run()
    assert done == [] and len(died) == 1 and died[0][0] is held and isinstance(died[0][1], SystemExit)


def test_a_closed_loop_stops_the_worker_after_the_batch_it_could_not_deliver():
    clock = FakeClock(100.0)
    loop = DeliveringLoop()
    backend = Backend(clock)
    worker, done, _ = worker_of(clock, backend, Script(clock, batch(clock, "a"), batch(clock, "b")), loop=loop)
    loop.closed = True  # (the process is exiting)
    worker._run()
    assert backend.calls == [["a"]] and done == []


def test_a_pipelined_backend_launches_the_next_full_batch_before_collecting_the_one_computing():
    clock = FakeClock(100.0)
    one, two, three = batch(clock, "one"), batch(clock, "two"), batch(clock, "three")
    script = Script(clock, one, two, three)
    backend = Pipelined(clock)
    behind: list[tuple[Batch | None, Batch | None]] = []
    collect = backend.collect

    def watching(handle: list[str]) -> list[str]:
        behind.append((worker.current, worker.behind))
        return collect(handle)

    backend.collect = watching  # type: ignore[method-assign]
    worker, done, died = worker_of(clock, backend, script)
    worker._run()
    assert not died and done == [one, two, three]
    assert backend.order == ["launch one", "launch two", "collect one", "launch three", "collect two", "collect three"]
    assert behind == [(one, two), (two, three), (three, None)]  # one computing, one launched behind it
    assert [taker for _, taker in script.asks] == [True, False, False, False, True]  # parks only with nothing in flight
    assert two.started_at == one.finished_at and three.started_at == two.finished_at  # the device never idles
    assert [b.outputs for b in done] == [["ONE"], ["TWO"], ["THREE"]]
    assert worker.busy_s == approx(3 * BATCH_S) and worker.behind is None and worker.current is None


def test_a_pipelined_batch_whose_launch_fails_is_run_again_as_a_plain_call_in_its_turn():
    clock = FakeClock(100.0)
    one, two = batch(clock, "one"), batch(clock, "poison", "b")
    backend = Pipelined(clock, fail_launch_of="poison")
    worker, done, _ = worker_of(clock, backend, Script(clock, one, two), max_isolation_calls=4)
    worker._run()
    assert done == [one, two] and one.outputs == ["ONE"]
    assert backend.order == ["launch one", "launch poison", "collect one"]
    assert backend.calls == [["poison", "b"], ["poison"], ["b"]]  # the usual way: whole, then bisected
    assert two.outputs == [None, "B"] and list(two.failures or {}) == [0]


@pytest.mark.parametrize("backend_kind", [Backend, Pipelined])
def test_warm_up_is_timed_on_the_workers_clock(backend_kind: type[Backend]):
    clock = FakeClock(100.0)
    worker, _, died = worker_of(clock, backend_kind(clock), Script(clock))
    worker._warmup_inputs = ["w"]
    worker._run()
    assert not died and worker.ready
    assert worker.warmup_s == approx(BATCH_S) and worker.measured_costs == [(0, 1, approx(BATCH_S))]
    assert worker.warmup_report["warmup_s"] == approx(BATCH_S)

