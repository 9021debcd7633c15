"""The batcher's rule on a fake clock: when a batch is due, which bucket goes, who takes it, and the
echo hold for closed-loop clients. No threads, no sleeps: takers are plain callables."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from inferd.messages import Batch, PendingRequest, RequestState
from inferd.scheduling.arrivals import BESIDE_S
from inferd.scheduling.batch_costs import BatchCosts
from inferd.scheduling.batcher import PROBE_EVERY, Batcher, QueueFull

from ...helpers import FakeClock
from .test_batch_costs import CPU, settled


class Takers:
    """Parked workers as the batcher sees them: callables that receive a batch (or None)."""

    def __init__(self) -> None:
        self.got: list[Batch | None] = []

    def __call__(self, batch: Batch | None) -> None:
        self.got.append(batch)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


def batcher(clock: FakeClock, *, max_batch_size: int = 4, max_wait_ms: float = 20, max_queue: int = 100,
            batch_time_s: float = 0.01, costs: BatchCosts | None = None) -> Batcher:
    """A batcher whose batches cost `batch_time_s` whatever their size (unless `costs` says otherwise)."""
    loop = asyncio.new_event_loop()  # only for the coroutine's wake-up event; nothing runs on it
    if costs is None:
        costs = BatchCosts(max_batch_size)
        costs.measured([(0, 1, batch_time_s)])
    b = Batcher(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=max_queue, loop=loop,
                batch_time_s=lambda: batch_time_s, costs=costs, clock=clock)
    b._test_loop = loop  # type: ignore[attr-defined]
    return b


@pytest.fixture(autouse=True)
def _close_loops(request):  # type: ignore[no-untyped-def]
    yield
    for value in request.node.funcargs.values():
        loop = getattr(value, "_test_loop", None)
        if loop is not None:
            loop.close()


def arrive(b: Batcher, clock: FakeClock, name: str, *, bucket: int = 0, timeout_s: float = 10.0) -> PendingRequest:
    r = PendingRequest(name, name, clock(), clock() + timeout_s, None, bucket=bucket, due=clock() + timeout_s)  # type: ignore[arg-type]
    b.submit(r)
    return r


def names(batch: Batch | None) -> list[str]:
    assert batch is not None
    return [r.request_id for r in batch.requests]


def busy(b: Batcher, clock: FakeClock, per_s: float = 2000.0) -> None:
    """As if requests had been arriving at `per_s` for a while (the rate the rule reads)."""
    b._arrivals.score, b._arrivals.at, b._arrivals.since = per_s, clock(), clock() - 10.0


def test_a_free_worker_parks_while_arrivals_are_coming_and_gets_the_full_batch_handed_over(clock):
    b, takers = batcher(clock), Takers()
    busy(b, clock)
    arrive(b, clock, "a")
    assert b.next_batch((), takers) is None  # more are coming within the linger: the worker parks
    for name in "bcd":
        arrive(b, clock, name)
    assert len(takers.got) == 1 and names(takers.got[0]) == ["a", "b", "c", "d"]
    assert takers.got[0].trigger == "full" and b.depth == 0


def test_a_lone_request_goes_at_once_when_nothing_else_is_coming(clock):
    b = batcher(clock)
    arrive(b, clock, "lone")
    batch = b.next_batch((), Takers())
    assert names(batch) == ["lone"] and batch.trigger == "sparse"


def test_requests_that_lingered_go_at_once_to_a_worker_that_frees(clock):
    b = batcher(clock)
    busy(b, clock)
    arrive(b, clock, "a")
    clock.advance(0.025)  # every worker was busy meanwhile
    batch = b.next_batch((), Takers())
    assert names(batch) == ["a"] and batch.trigger == "idle_worker"


def test_the_linger_is_cut_short_by_a_deadline_it_would_miss(clock):
    b = batcher(clock, max_wait_ms=50, batch_time_s=0.01)
    busy(b, clock)
    arrive(b, clock, "tight", timeout_s=0.03)  # must start by 100.02 to finish by 100.03
    assert b.next_batch((), Takers()) is None
    clock.advance(0.021)
    busy(b, clock)
    assert names(b.next_batch((), Takers())) == ["tight"]
    assert b.flushes["deadline"] == 1


def test_a_full_bucket_goes_before_an_older_partial_one_and_batches_never_mix_buckets(clock):
    b = batcher(clock, batch_time_s=0.05)  # the age gap is two batch times: 100 ms
    busy(b, clock)
    arrive(b, clock, "long-1", bucket=1)
    clock.advance(0.001)
    for i in range(4):
        arrive(b, clock, f"short-{i}", bucket=0)
    clock.advance(0.03)
    first, second = b.next_batch((), Takers()), b.next_batch((), Takers())
    assert names(first) == [f"short-{i}" for i in range(4)] and names(second) == ["long-1"]


def arrive_call(b: Batcher, clock: FakeClock, call: str, inputs: int, size: int, bucket: int) -> None:
    """`inputs` of a call of `size` inputs in all queue in `bucket` (its others are elsewhere)."""
    for i in range(inputs):
        r = PendingRequest(f"{call}.{i}", i, clock(), clock() + 10.0, None, bucket=bucket, due=clock() + 10.0,  # type: ignore[arg-type]
                           call_id=call, call_size=size)
        b.submit(r)


def test_a_short_call_waits_for_one_batch_not_for_the_large_calls_older_buckets_and_others_still_go(clock):
    b = batcher(clock, max_batch_size=8, batch_time_s=0.05, max_queue=1000)  # a call of at most 2 inputs is short
    busy(b, clock)
    arrive_call(b, clock, "large-a", 16, 40, bucket=0)
    clock.advance(0.3)  # past the age gap (100 ms): no full batch would jump bucket 0's
    arrive_call(b, clock, "large-b", 16, 40, bucket=1)
    arrive_call(b, clock, "short", 2, 2, bucket=1)
    first = b.next_batch((), Takers())
    assert first is not None and first.bucket == 1 and {"short.0", "short.1"} <= set(names(first))
    assert b.next_batch((), Takers()).bucket == 0  # type: ignore[union-attr]  # (nothing short left: the oldest)
    # short calls arriving without end in bucket 1 leave bucket 0's large ones 2 batches of every 8
    served = []
    for n in range(16):
        arrive_call(b, clock, f"large-{n}", 8, 40, bucket=0)
        arrive_call(b, clock, f"short-{n}", 2, 2, bucket=1)
        clock.advance(0.05)
        served.append(b.next_batch((), Takers()).bucket)  # type: ignore[union-attr]
    assert all(served[i:i + 8].count(0) >= 2 for i in range(9)) and served.count(1) >= 10


def test_a_short_calls_partial_batch_is_not_held_for_a_closed_loop_echo(clock):
    """The echo hold keeps a stale partial batch back for clients about to send again; a short call's
    batch going first is not held (it would wait behind the echo and the full batch it brings)."""
    b = batcher(clock, max_batch_size=8, batch_time_s=0.05)
    busy(b, clock)
    b.echo.score = 1.0  # closed-loop clients: their echo is expected
    arrive_call(b, clock, "large", 16, 40, bucket=0)
    clock.advance(0.3)
    arrive_call(b, clock, "short", 2, 2, bucket=1)
    clock.advance(0.03)  # lingered: due, partial
    batch = b.next_batch(answered(8), Takers())
    assert batch is not None and names(batch) == ["short.0", "short.1"] and b.echo.holds == 0


def test_the_queue_bound_and_withdrawal(clock):
    b = batcher(clock, max_queue=2)
    a, _ = arrive(b, clock, "a"), arrive(b, clock, "b")
    with pytest.raises(QueueFull):
        arrive(b, clock, "c")
    assert b.withdraw(a, RequestState.CANCELLED) and not b.withdraw(a, RequestState.CANCELLED)
    assert b.depth == 1
    clock.advance(0.03)
    assert names(b.next_batch((), Takers())) == ["b"]  # the withdrawn one never runs


def test_stop_releases_parked_workers_and_returns_what_waited(clock):
    b, takers = batcher(clock), Takers()
    b.next_batch((), takers)
    r = arrive(b, clock, "a")
    assert b.stop() == [r] and takers.got == [None]
    late = Takers()
    assert b.next_batch((), late) is None and late.got == [None]  # asking after the stop: told at once


def answered(n: int) -> list[None]:
    """The connections a batch of `n` requests answered: none known (`Batch.clients`)."""
    return [None] * n


def run_cycle(b: Batcher, clock: FakeClock, finished: int, echo: int, compute_s: float = 0.05) -> Batch | None:
    """A batch of `finished` requests ends now; `echo` of its clients send again within 2 ms; the worker
    is free again after `compute_s` and asks for the next batch."""
    clock.advance(compute_s)
    batch = b.next_batch(answered(finished), Takers())
    for i in range(echo):
        clock.advance(0.0005)
        arrive(b, clock, f"echo-{clock():.4f}-{i}")
    return batch


def test_closed_loop_echoes_make_a_free_worker_wait_for_them_and_open_loop_arrivals_do_not(clock):
    b = batcher(clock, max_batch_size=8, max_wait_ms=10)
    for _ in range(6):  # clients answered in a batch come straight back, quiet otherwise: the echo score rises
        run_cycle(b, clock, finished=4, echo=4)
        b.withdraw_all()
    assert b.echo.score >= 0.5
    clock.advance(0.05)
    arrive(b, clock, "stale")  # a partial, stale queue (one group of a split closed loop)
    clock.advance(0.011)
    holds = b.echo.holds
    assert b.next_batch(answered(4), Takers()) is None  # instead of a batch of one, it waits for the echo
    assert b.echo.holds == holds + 1
    assert b._decision(clock(), "linger").due_at == pytest.approx(clock() + 0.01)  # for a batch's time at most
    clock.advance(0.002)
    arrive(b, clock, "first-back")  # the first of its clients back: the hold ends with this one's linger at the latest
    assert b.echo.hold_until == pytest.approx(clock() - 0.002 + 0.01)  # (the batch's time came first here)

    open_loop = batcher(FakeClock(100.0), max_batch_size=8, max_wait_ms=10)
    c = open_loop._clock
    for _ in range(6):  # arrivals at the same rate all through the cycle: never held
        open_loop.next_batch(answered(4), Takers())
        for _ in range(20):
            c.advance(0.005)
            arrive(open_loop, c, f"o{c():.4f}")
        open_loop.withdraw_all()
    assert open_loop.echo.score < 0.5


def test_a_full_queue_makes_room_by_shedding_a_lower_tier_then_a_heavier_tenant(clock):
    loop = asyncio.new_event_loop()
    b = Batcher(max_batch_size=100, max_wait_ms=20, max_queue=4, loop=loop, clock=clock,
                tiers=(("paid", None), ("free", None)))
    try:
        def enqueue(name: str, tier: str, tenant: str) -> PendingRequest | None:
            r = PendingRequest(name, name, clock(), clock() + 10, None, tier=tier, tenant=tenant)  # type: ignore[arg-type]
            return b.submit(r)

        for i in range(3):
            assert enqueue(f"heavy{i}", "paid", "heavy") is None
        assert enqueue("free0", "free", "cats") is None
        shed = enqueue("paid-newcomer", "paid", "light")  # the queue is full: the free request makes room
        assert shed is not None and shed.request_id == "free0" and shed.state is RequestState.REJECTED
        shed = enqueue("light1", "paid", "light")  # no lower tier left: heavy (3) holds more than light (1) + 1
        assert shed is not None and shed.request_id == "heavy2"  # heavy's newest
        with pytest.raises(QueueFull):
            enqueue("light2", "paid", "light")  # heavy 2, light 2: nobody is heavier: the newcomer is refused
        with pytest.raises(QueueFull):
            enqueue("free1", "free", "cats")  # a lower tier never pushes out a higher one
        assert b.depth == 4 and b.shed == 2
        assert sum(b.ahead_by_bucket("paid", "light").values()) == 4
        assert sum(b.ahead_by_bucket("paid", "newcomer").values()) == 2
    finally:
        loop.close()


def test_the_arrival_rate_counts_the_last_second_or_so(clock):
    b = batcher(clock, max_queue=1000)
    for i in range(200):  # 200 requests over one second
        arrive(b, clock, f"r{i}")
        clock.advance(0.005)
    assert b.arrival_rate(clock()) == pytest.approx(200 * (1 - math.exp(-1)), rel=0.05)
    clock.advance(3.0)
    assert b.arrival_rate(clock()) < 10  # quiet since: it fades


def test_how_long_a_new_request_would_linger_is_the_rules_own_answer(clock):
    b = batcher(clock, max_wait_ms=20)
    newcomer = PendingRequest("n", "n", clock(), clock() + 10, None, due=clock() + 10)  # type: ignore[arg-type]
    assert b.linger_left(newcomer, clock()) == 0.0  # nothing else coming: it would go at once (sparse)
    busy(b, clock)
    assert b.linger_left(newcomer, clock()) == pytest.approx(0.02 - 1 / 2000)  # the linger, less its useless tail
    for name in "abc":
        arrive(b, clock, name)
    assert b.linger_left(newcomer, clock()) == 0.0  # it would fill the batch of 4


def test_a_higher_tiers_batches_count_against_the_lower_tiers_less_what_their_riders_would_have_cost(clock):
    """What a lower tier's wait reads of a higher tier's batches: their time, less what the lower tiers'
    requests riding in them would have cost in full batches of their own."""
    loop = asyncio.new_event_loop()
    costs = BatchCosts(8)
    costs.measured([(0, 8, 0.08)])  # (a flat curve: 80 ms for any size; a full batch's slot, 10 ms)
    b = Batcher(max_batch_size=8, max_wait_ms=20, max_queue=100, loop=loop, clock=clock, costs=costs,
                tiers=(("enterprise", None), ("free", None)))

    def batch_of(tiers: list[str]) -> None:
        for i, tier in enumerate(tiers):
            b.submit(PendingRequest(f"r{i}", f"r{i}", clock(), clock() + 10, None, tier=tier))  # type: ignore[arg-type]
        clock.advance(0.05)  # (a partial batch goes once its linger has passed)
        taken = b.next_batch((), Takers())
        assert taken is not None and taken.size == len(tiers)

    try:
        enterprise = b.tier_rank("enterprise")
        assert b.time_taken(enterprise, clock()) == (0.0, 1.0)  # nothing noted: all of the forced batches count
        batch_of(["enterprise"] * 2 + ["free"] * 6)  # full: the riders' 60 ms they would have cost anyway
        assert b.time_taken(enterprise, clock())[1] == pytest.approx(0.25)
        clock.advance(5.0)  # (faded)
        batch_of(["enterprise"] * 2 + ["free"] * 2)  # half full: 80 ms, of which the riders' part is 20
        seconds, share = b.time_taken(enterprise, clock())
        assert share == pytest.approx(0.75, rel=0.01) and seconds > 0
        assert b.arrival_rates_above("enterprise", clock()) == []
        [(rank, rate)] = b.arrival_rates_above("free", clock())
        assert rank == enterprise and rate > 0
    finally:
        loop.close()


def test_a_request_due_before_the_batcher_wakes_wakes_it_and_goes_by_its_due(clock):
    """A request whose due comes before the batcher's sleep ends (a higher tier's tighter objective
    joining a long linger) wakes it; one due later does not (no decision per request)."""
    b = batcher(clock, max_wait_ms=500, batch_time_s=0.01)
    busy(b, clock)
    arrive(b, clock, "a")
    assert b.next_batch((), Takers()) is None  # the worker parks: "a" lingers for more
    sleep_until = b.dispatch(clock())
    assert sleep_until is not None and sleep_until > clock() + 0.2
    b.woken()  # (whatever parking asked)
    clock.advance(0.01)
    arrive(b, clock, "b")
    assert not b.woken()  # due in 10 s: it cannot make the bucket due sooner
    now = clock()  # another tenant's (a tenant's own later requests wait behind its head)
    b.submit(PendingRequest("tight", "tight", now, now + 0.05, None, due=now + 0.05, tenant="other"))  # type: ignore[arg-type]
    assert b.woken()
    next_due = b.dispatch(clock())
    assert next_due is not None and next_due < clock() + 0.05  # its latest start, not the linger's end
    clock.advance(next_due - clock())
    taken = Takers()
    b._takers.clear()
    b._takers.append(taken)
    assert b.dispatch(clock()) is None
    assert sorted(names(taken.got[0])) == ["a", "b", "tight"] and taken.got[0].trigger == "deadline"


async def test_the_sleeping_batcher_coroutine_is_woken_by_a_sooner_due():
    """`run` on a real loop: a worker parked, a request lingering for 5 s; another tenant's request due in
    0.5 s goes by its due (trigger "deadline") with it. Before, the coroutine slept on (a second at most,
    then took what was due), and the second request had expired in the queue by then."""
    loop = asyncio.get_running_loop()
    costs = BatchCosts(4)
    costs.measured([(0, 1, 0.01)])
    b = Batcher(max_batch_size=4, max_wait_ms=5000, max_queue=100, loop=loop, batch_time_s=lambda: 0.01, costs=costs)
    busy(b, time.monotonic)
    running = asyncio.ensure_future(b.run())
    got: asyncio.Future[Batch | None] = loop.create_future()
    try:
        now = time.monotonic()
        b.submit(PendingRequest("a", "a", now, now + 10.0, None, due=now + 10.0))  # type: ignore[arg-type]
        assert b.next_batch((), lambda batch: loop.call_soon_threadsafe(got.set_result, batch)) is None
        await asyncio.sleep(0.05)  # the coroutine decides nothing is due, and sleeps until the linger ends
        now = time.monotonic()
        b.submit(PendingRequest("tight", "tight", now, now + 0.5, None, due=now + 0.5, tenant="other"))  # type: ignore[arg-type]
        batch = await asyncio.wait_for(got, 5.0)
        assert batch is not None and batch.trigger == "deadline" and sorted(names(batch)) == ["a", "tight"]
    finally:
        b.stop()
        await asyncio.wait_for(running, 5.0)


def test_a_tenants_request_due_before_its_own_lingering_requests_goes_by_its_due(clock):
    """The same tenant's tight request behind its own lingering one (before, only each tenant's head set
    the bucket's due, and it waited out the linger and expired in the queue)."""
    b = batcher(clock, max_wait_ms=500, batch_time_s=0.01)
    busy(b, clock)
    arrive(b, clock, "a")
    assert b.next_batch((), Takers()) is None
    b.dispatch(clock())
    b.woken()
    clock.advance(0.01)
    tight = arrive(b, clock, "tight", timeout_s=0.05)
    assert b.woken()
    next_due = b.dispatch(clock())
    assert next_due is not None and next_due < tight.due
    clock.advance(next_due - clock())
    taken = Takers()
    b._takers.clear()
    b._takers.append(taken)
    assert b.dispatch(clock()) is None
    assert names(taken.got[0]) == ["a", "tight"] and taken.got[0].trigger == "deadline"


def test_a_size_limit_cut_by_a_measurement_is_probed_past_and_lifted_when_the_measurement_was_wrong(clock):
    """Without an objective a bucket's batch stops where larger batches were measured slower (a CPU's
    curve). One warm-up call of 8 on a noisy host read 80 ms where 8 take 30: the limit fell to 4, and
    no batch of 8 would ever run to correct it. One batch in `PROBE_EVERY` with more waiting grows to
    twice the limit, and the sizes it measures lift the limit back."""
    costs = settled(BatchCosts(16), [(0, 1, 0.010), (0, 4, 0.020), (0, 8, 0.080), (0, 16, 0.160)])
    assert costs.size_limit(0) == 4
    b = batcher(clock, max_batch_size=16, max_queue=1000, costs=costs)
    busy(b, clock)
    sizes: list[int] = []
    while costs.size_limit(0) < 16 and len(sizes) < PROBE_EVERY * 40:
        while b.depth < 100:
            arrive(b, clock, f"r{len(sizes)}.{b.depth}")
        batch = b.next_batch((), Takers())
        assert batch is not None
        sizes.append(len(batch.requests))
        costs.observe(0, len(batch.requests), 0.015 + 0.002 * len(batch.requests), clock())  # the truth
        clock.advance(0.01)
    assert sizes[:PROBE_EVERY] == [4] * (PROBE_EVERY - 1) + [8]  # the limit, and once in PROBE_EVERY twice it
    assert b.size_probes == len(sizes) // PROBE_EVERY  # (every batch was taken at a cut limit)
    assert costs.size_limit(0) == 16  # lifted step by step (8, then 16, measured again), within 40 probes
    with_objective = settled(BatchCosts(16, slo_s=1.0), [(0, 1, 0.010), (0, 4, 0.020), (0, 8, 0.080), (0, 16, 0.160)])
    b = batcher(clock, max_batch_size=16, max_queue=1000, costs=with_objective)  # (its own trade: no probes)
    for i in range(400):
        arrive(b, clock, f"o{i}")
    assert {len(b.next_batch((), Takers()).requests) for _ in range(PROBE_EVERY * 2)} == {with_objective.size_limit(0)}  # type: ignore[union-attr]


def test_beside_short_calls_a_large_calls_batch_stops_short_and_a_short_call_begins_its_batch(clock):
    """Large calls alone fill to the cost model's bulk limit. A short call arriving beside them makes
    batches stop at the smallest size with 95% of the best throughput (the batch running is what it
    waits for), and its bucket's next batch begins with it even where a large call's last inputs (few
    enough to go whole) come first in turn order; bulk work alone for `BESIDE_S` fills again."""
    costs = settled(BatchCosts(64), CPU)
    top = costs.size_limit(0)
    b = batcher(clock, max_batch_size=64, max_queue=1000, costs=costs)  # a call of at most 16 inputs is short
    busy(b, clock)
    arrive_call(b, clock, "large-a", 60, 100, bucket=0)
    assert len(b.next_batch((), Takers()).requests) == top  # type: ignore[union-attr]
    arrive_call(b, clock, "large-b", 10, 100, bucket=0)  # (its last ten here: they go whole in its turn)
    arrive_call(b, clock, "short", 3, 3, bucket=0)
    knee = costs.size_limit(0)
    assert costs.short_calls_beside_large and knee < top
    batch = b.next_batch((), Takers())
    assert names(batch)[:3] == ["short.0", "short.1", "short.2"] and len(names(batch)) <= knee
    assert len(b.next_batch((), Takers()).requests) == knee  # type: ignore[union-attr]
    clock.advance(BESIDE_S)
    arrive_call(b, clock, "large-c", 60, 100, bucket=0)
    assert not costs.short_calls_beside_large and costs.size_limit(0) == top


def test_admission_reads_behind_whom_a_request_waits_while_a_worker_takes_batches():
    """`ahead_by_bucket` walks the tiers' tenants and calls, which a worker's thread changes as it takes a
    batch: read bare, a mixed soak got 500s ("dictionary changed size during iteration"). Threads switch
    every microsecond here, so a bare read meets a take within a second."""
    import sys
    import threading

    loop = asyncio.new_event_loop()
    b = Batcher(max_batch_size=64, max_wait_ms=0, max_queue=100_000, loop=loop, tiers=(("paid", None), ("free", None)))
    stop, failures = threading.Event(), []

    def worker() -> None:
        try:
            while not stop.is_set():
                b.next_batch((), lambda batch: None)  # (whatever waits: no linger; parked, handed the next)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        n, end = 0, time.monotonic() + 1.5
        while time.monotonic() < end and not failures:
            for _ in range(100):
                n += 1
                for j in range(1 + n % 3):  # calls of 1-3 inputs from seven tenants in two tiers
                    b.submit(PendingRequest(f"r{n}.{j}", n, time.monotonic(), time.monotonic() + 60, None,  # type: ignore[arg-type]
                                            tier="paid" if n % 2 else "free", tenant=f"t{n % 7}", call_id=f"c{n}",
                                            call_size=1 + n % 3))
            for _ in range(50):
                b.ahead_by_bucket("free", "t3", None)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
        loop.close()
    assert not failures, failures
