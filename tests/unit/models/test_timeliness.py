"""A batch model's admission question on a fake clock: a request that would not finish by its deadline
or its latency objective is refused at once (never a 504 later), and under overload the queue holds
about one objective's worth of work while every admitted request meets it."""

from __future__ import annotations

import asyncio
import random
import re
from types import SimpleNamespace

import pytest

from inferd.backends.sim import SimulatedGPU
from inferd.config import ModelConfig, TierConfig
from inferd.errors import ServiceOverloaded
from inferd.messages import Batch
from inferd.models.batch_model import BatchModel
from inferd.observability.metrics import RequestMetrics
from inferd.scheduling.batch_costs import SETTLING_RUNS

from ...helpers import FakeClock


class FakeDevice:
    """One worker as the model sees it: it takes the next batch when free and runs it for as long as
    the simulated GPU says, on the fake clock. Nothing runs on a thread."""

    def __init__(self, model: BatchModel, clock: FakeClock, gpu: SimulatedGPU) -> None:
        self.model, self.clock, self.gpu = model, clock, gpu
        self.worker = SimpleNamespace(healthy=True, current=None, behind=None)
        model.pool.workers, model.pool.healthy = [self.worker], 1
        self.handed: list[Batch | None] = []
        self.ends_at = 0.0
        self.finished: list = []
        self.parked = False
        self.batches: list[Batch] = []

    def step(self) -> None:
        """Finish the running batch if its time is up, then take the next one if one is due."""
        now = self.clock()
        batch = self.worker.current
        if batch is not None and now >= self.ends_at:
            batch.finished_at = now
            batch.outputs = [r.input for r in batch.requests]
            self.worker.current, self.finished = None, batch.clients()
            self.model.delivery.batch_done(batch)
            self.batches.append(batch)
        if self.parked:
            self.model.batcher.dispatch(now)  # (what the batcher's coroutine does: lingers that ran out)
        if self.worker.current is None:
            batch = self.handed.pop() if self.handed else None
            if batch is None and not self.parked:
                batch = self.model.batcher.next_batch(self.finished, self.handed.append)
                self.parked = batch is None
            if batch is not None:
                self.parked = False
                batch.started_at = now
                self.worker.current = batch
                self.ends_at = now + self.gpu.call_s([r.input for r in batch.requests])


def model(clock: FakeClock, tiers: tuple[TierConfig, ...] = (TierConfig("default"),), **kw) -> BatchModel:  # type: ignore[no-untyped-def]
    config = ModelConfig(name="m", backend="inferd.backends.sim:create", **{"max_batch_size": 32, "max_queue": 5000, **kw})
    served = BatchModel(config, asyncio.get_running_loop(), RequestMetrics(), tiers=tiers, clock=clock)
    served.forecast.observe_batch(0.05)
    served.costs.measured([(0, 1, 0.05)])  # the warm-up call: 50 ms
    return served


async def test_a_request_that_would_miss_its_deadline_or_objective_is_refused_at_once():
    clock = FakeClock()
    served = model(clock, slo_ms=300)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(32 * 5):  # the last of these: 4 batches ahead (200 ms), its own 50 ms, 10% slack: 275 ms
        served.submit(f"r{i}", f"in {i}", 2.0)
    with pytest.raises(ServiceOverloaded) as refused:
        served.submit("late", "late", 2.0)  # behind 5 batches: 300 ms, 330 with the slack
    assert refused.value.reason == "slo_infeasible" and refused.value.retry_after_ms > 0
    with pytest.raises(ServiceOverloaded) as refused:
        served.submit("hurried", "hurried", 0.1)  # its own deadline, sooner than the objective
    assert refused.value.reason == "deadline_infeasible"
    assert served.batcher.depth == 160  # nothing refused was queued


async def test_a_tier_objective_or_wait_limit_refuses_that_tier_while_another_still_gets_in():
    clock = FakeClock()
    tiers = (TierConfig("enterprise", priority=2, slo_ms=1000), TierConfig("free", priority=0, slo_ms=150))
    served = model(clock, tiers=tiers)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(64):  # enterprise arriving at about 64 a second, a tenth of capacity
        served.submit(f"f{i}", f"free {i}", 5.0, tier="enterprise")
        clock.advance(0.015)
    with pytest.raises(ServiceOverloaded) as refused:
        served.submit("free", "free", 5.0, tier="free")  # 100 ms ahead, 50 of its own, and the slack: > 150
    assert refused.value.reason == "slo_infeasible"
    assert served.submit("paying", "paying", 5.0, tier="enterprise").predicted_wait == pytest.approx(0.1)
    limited = model(clock, tiers=(TierConfig("paid", priority=1), TierConfig("free", max_predicted_wait_ms=60)))
    FakeDevice(limited, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(64):
        limited.submit(f"p{i}", f"p {i}", 5.0, tier="paid")
        clock.advance(0.015)
    with pytest.raises(ServiceOverloaded) as refused:
        limited.submit("free", "free", 5.0, tier="free")
    assert refused.value.reason == "tier_predicted_wait"


async def test_only_a_request_that_could_be_refused_is_asked_the_exact_question():
    clock = FakeClock()
    far = model(clock, timeout_ms=10_000)  # no objective, deadlines far off: nothing to decide
    FakeDevice(far, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    easy = [far.submit(f"easy{i}", f"easy {i}", 10.0) for i in range(32)]
    asked_anyway = [r for r in easy if r.predicted_wait is not None]
    assert asked_anyway == [easy[15], easy[31]]  # one in 16 is asked all the same: predictions stay measured
    for i in range(32 * 5):  # 6 batches of 50 ms ahead, more than a short deadline allows
        far.submit(f"r{i}", f"r {i}", 10.0)
    with pytest.raises(ServiceOverloaded) as refused:
        far.submit("hurried", "hurried", 0.2)  # near its deadline: asked, and refused
    assert refused.value.reason == "deadline_infeasible"
    asked = far.submit("patient", "patient", 1.0)  # the bound no longer holds: asked, and admitted
    assert asked.predicted_wait is not None and asked.predicted_wait > 0.2
    objective = model(clock, slo_ms=300)  # with an objective, or with tiers, every request is asked
    FakeDevice(objective, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    assert objective.submit("o", "o", 10.0).predicted_wait is not None
    tiered = model(clock, tiers=(TierConfig("paid", priority=1), TierConfig("free")))
    FakeDevice(tiered, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    assert tiered.submit("t", "t", 10.0, tier="free").predicted_wait is not None


async def test_the_bound_kept_between_batches_is_the_bound_made_afresh_and_follows_the_cost_model():
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    timeliness, costs = served.timeliness, served.costs

    def afresh(request) -> bool:  # type: ignore[no-untyped-def]
        """The bound as its docstring states it, from the cost model as it is now."""
        waiting = served.batcher.depth + served.config.workers + 1
        bound = served.config.max_wait_ms / 1000 + costs.costliest_batch_s() * waiting * (1 + costs.slack)
        return clock() + bound <= request.due

    probe = served.submit("probe", "probe", 1.0)
    for i in range(5):  # bounded as 7 batches of 50 ms (each waiting request one of its own): within 1 s
        served.submit(f"r{i}", f"r {i}", 10.0)
    assert timeliness.surely_in_time(probe, clock()) is afresh(probe) is True
    for seconds in (0.4, 0.5, 0.6):  # the model turns ~10x slower: its estimates move, and the bound with them
        costs.observe(0, 32, seconds, clock())
        assert timeliness.surely_in_time(probe, clock()) is afresh(probe)
    assert afresh(probe) is False


@pytest.mark.parametrize("load", [1.2, 2.0])
async def test_overload_keeps_the_queue_within_the_objective_and_every_admitted_request_meets_it(load):
    clock = FakeClock()
    served = model(clock, slo_ms=300, timeout_ms=2000)
    device = FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32, jitter=0.02, seed=3))
    capacity = 32 / 0.05  # 640 requests/s
    rng = random.Random(7)
    admitted, refused, next_arrival, i = [], 0, clock(), 0
    end = clock() + 10.0
    while clock() < end:
        while next_arrival <= clock():
            try:
                admitted.append(served.submit(f"r{i}", f"input {i}", 2.0))
            except ServiceOverloaded as error:
                assert error.reason == "slo_infeasible"
                refused += 1
            next_arrival += rng.expovariate(load * capacity)
            i += 1
        device.step()
        # what is queued would be drained within the objective
        assert served.predicted_wait_s() <= 0.3
        clock.advance(0.0005)
    done = [r for r in admitted if r.batch is not None and r.batch.finished_at]
    latencies = sorted(r.batch.finished_at - r.enqueued_at for r in done)
    assert latencies[-1] <= 0.3  # every admitted request met its objective (on the fake clock)
    served_per_s = len(done) / 10.0
    assert served_per_s >= 0.95 * capacity  # and the device was kept busy with full batches
    assert refused > 0 and all(r.state.value == "taken" for r in done)
    errors = served.timeliness.wait_error["default"]
    assert errors.count == len(done) and abs(errors.mean) < 0.01  # predictions within 10 ms on average


def drive(served: BatchModel, device: FakeDevice, clock: FakeClock, rate: float, seconds: float, rng: random.Random,
          timeout_s: float = 2.0, odd: dict[int, str] | None = None) -> tuple[list, list[ServiceOverloaded]]:
    """Open-loop Poisson arrivals at `rate` for `seconds` of the fake clock, the device stepping every
    0.5 ms; `odd`: the inputs to send instead at those arrival numbers. Returns (admitted, refusals)."""
    admitted, refused = [], []
    next_arrival, i, end = clock(), 0, clock() + seconds
    while clock() < end:
        while next_arrival <= clock():
            text = (odd or {}).get(i, f"input {clock():.6f} {i}")
            try:
                admitted.append(served.submit(f"r{clock():.6f}.{i}", text, timeout_s, tenant=f"t{i % 7}"))
            except ServiceOverloaded as error:
                refused.append(error)
            next_arrival += rng.expovariate(rate)
            i += 1
        device.step()
        clock.advance(0.0005)
    return admitted, refused


def answered_within(requests: list, start: float, end: float) -> int:
    return sum(1 for r in requests if r.batch is not None and start <= r.batch.finished_at < end and r.future.done()
               and not r.future.cancelled() and r.future.exception() is None)


async def test_a_refusal_states_the_figures_it_compared():
    clock = FakeClock()
    served = model(clock, slo_ms=300)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(32 * 5):
        served.submit(f"r{i}", f"in {i}", 2.0)
    with pytest.raises(ServiceOverloaded) as refused:
        served.submit("late", "late", 2.0)
    figures = re.fullmatch(r"predicted (\d+) ms \(wait (\d+) ms, compute (\d+) ms\) plus a (\d+) ms margin exceeds "
                           r"this request's (\d+) ms latency objective", refused.value.message)
    assert figures is not None, refused.value.message
    predicted, wait, compute, margin, budget = map(int, figures.groups())
    assert abs(predicted - (wait + compute)) <= 1 and predicted + margin > budget == 300
    timing = dict(re.findall(r"(\w+);dur=([\d.]+)", refused.value.server_timing or ""))
    assert round(float(timing["predicted"])) == predicted and round(float(timing["margin"])) == margin
    assert round(float(timing["budget"])) == budget


async def test_a_single_stall_does_not_refuse_requests_with_ten_times_the_time_they_need_once_it_has_passed():
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    gpu = SimulatedGPU(latency_ms=50, max_batch_size=32)
    device = FakeDevice(served, clock, gpu)
    rng = random.Random(11)
    drive(served, device, clock, 200.0, 3.0, rng)  # a quarter of capacity: batches as estimated
    gpu.slowdown = 9.0  # one batch held up 400 ms (a collector, a preempted process)
    drive(served, device, clock, 200.0, 0.06, rng)
    gpu.slowdown = 1.0
    drive(served, device, clock, 200.0, 1.0, rng)  # it has passed
    admitted, refused = drive(served, device, clock, 200.0, 3.0, rng, timeout_s=1.0)
    assert len(admitted) > 400 and len(refused) == 0  # 1 s deadlines, over ten times what a request needs
    assert served.costs.slack == pytest.approx(0.1, abs=0.02)  # the stall has faded from the margin


async def test_one_very_long_input_does_not_lock_the_model_against_every_tenant():
    """The audit's case: one 90,000-character input (its batch 18 times the usual) on a model with an
    objective and no length buckets once left every tenant's request refused for good: nothing ran, so
    nothing corrected the figure. Now the model answers others again at once, and its throughput is
    back within seconds."""
    clock = FakeClock()
    served = model(clock, slo_ms=300)
    device = FakeDevice(served, clock, SimulatedGPU(latency_ms=20, per_token_ms=0.001, max_batch_size=32))
    rng = random.Random(13)
    before, _ = drive(served, device, clock, 500.0, 5.0, rng)
    start = clock()
    after, refused = drive(served, device, clock, 500.0, 30.0, rng, odd={0: "x" * 90_000})
    rate_before = answered_within(before, start - 4.0, start) / 4.0
    first_answered = min(r.batch.finished_at for r in after[1:] if r.batch is not None)
    assert first_answered - start < 10.0  # others are answered again within 10 s...
    assert answered_within(after, start + 20.0, start + 30.0) / 10.0 >= 0.9 * rate_before  # ...at the old rate by 30 s


async def test_a_model_with_nothing_to_do_admits_what_fits_without_its_margin_so_it_can_learn():
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for _ in range(3):  # batches have recently run four times their estimate: a wide margin
        served.costs.errors.observe(4.0, clock())
    served.costs.refresh_margins(clock())
    assert served.costs.slack > 2.5
    probe = served.submit("probe", "probe", 0.08)  # 50 ms of compute fits 80 ms; with the margin it would not
    assert probe.predicted_wait is not None
    with pytest.raises(ServiceOverloaded):
        served.submit("behind", "behind", 0.08)  # not idle any more: the margin holds


async def test_a_model_whose_estimates_refuse_everything_lets_one_request_a_second_through_and_recovers():
    """Estimates far too high (a level raised by a busy spell): every prediction is past every deadline
    and nothing runs to correct it, so once the model had nothing to do it refused for good. Now one
    request a second goes in as a probe; its batch corrects the estimates, and the rest follow."""
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    device = FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    rng = random.Random(17)
    drive(served, device, clock, 100.0, 2.0, rng)  # settled cells
    served.costs.level *= 200  # every batch now predicted at 10 s, against 1 s deadlines
    served.costs.revision += 1
    admitted, refused = drive(served, device, clock, 100.0, 1.5, rng, timeout_s=1.0)
    assert refused and 1 <= len(admitted) <= 2  # a probe, not a flood
    admitted, refused = drive(served, device, clock, 100.0, 30.0, rng, timeout_s=1.0)
    assert answered_within(admitted, clock() - 5.0, clock()) > 400  # all served again: ~100 a second


async def test_a_margin_never_exceeds_how_late_recent_answers_came():
    """A busy host: batches ran up to 3x their estimates (a wide margin), yet every answer came before
    its prediction. A request with 1.5x its predicted time left is admitted; without answers to go by,
    the margin alone refuses it."""
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(32 * 4):  # work ahead: four batches, 200 ms
        served.submit(f"r{i}", f"r {i}", 10.0)
    for _ in range(10):
        served.costs.errors.observe(3.0, clock())
    served.costs.refresh_margins(clock())
    with pytest.raises(ServiceOverloaded):
        served.submit("tight", "tight", 0.4)  # ~250 ms predicted, margin ~2x: refused
    for _ in range(8):  # answers came 20 ms before their predictions
        served.timeliness.lateness.observe(-0.02, clock())
    admitted = served.submit("tight again", "tight again", 0.4)
    assert admitted.predicted_start is not None and admitted.predicted_start - clock() < 0.4


def run_until_idle(served: BatchModel, device: FakeDevice, clock: FakeClock) -> None:
    """Step the device until nothing waits or runs."""
    while served.batcher.depth or device.worker.current is not None:
        device.step()
        clock.advance(0.001)


async def test_an_answer_s_lateness_is_against_the_batch_that_formed_not_the_one_it_expected():
    """A request that expected a batch of its own, joined by seven that came after it, is answered when
    a batch of eight ends: later than predicted, yet every batch ran as estimated. Counted as late, what
    bounds the margin held the size the prediction could not know (a closed loop's first request of a
    cycle joins the other seven each time), and no timing error at all."""
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    gpu = SimulatedGPU(latency_ms=50, per_item_ms=20, max_batch_size=32)
    device = FakeDevice(served, clock, gpu)
    for size in (1, 8):  # both shapes settled, as the device runs them
        for _ in range(SETTLING_RUNS + 1):
            served.costs.observe(0, size, gpu.call_s(["x"] * size), clock())
    served.submit("ahead", "ahead", 0.6)  # (deadlines a full batch of 32 would miss: every request is asked)
    while device.worker.current is None:  # running: what the next request waits for
        device.step()
        clock.advance(0.001)
    first = served.submit("first", "first", 0.6)
    assert first.predicted_start is not None
    for i in range(7):
        served.submit(f"joins {i}", f"joins {i}", 0.6)
    run_until_idle(served, device, clock)
    assert first.batch is not None and first.batch.size == 8
    assert first.predicted_wait is not None and first.predicted_wait < gpu.call_s(["x"])  # it went next, as predicted
    assert len(served.timeliness.lateness) == 9 and served.timeliness.lateness.bound_s(clock()) < 0.03  # (and "ahead"; not 0.14)


async def test_a_shape_still_learned_says_nothing_of_how_late_answers_come():
    """On a host slowed 30x since its warm-up, a shape's first batches run far past estimates still
    made of the warm-up: that is its cell's to learn (the margin's errors leave them out too), not how
    far predictions of known batches run off. Held, that onset bounded the margin at 3 s for 30 s."""
    clock = FakeClock()
    served = model(clock, timeout_ms=60_000, slo_ms=30_000)
    device = FakeDevice(served, clock, SimulatedGPU(latency_ms=1500, max_batch_size=32))  # warm-up: 50 ms
    for i in range(SETTLING_RUNS - 1):  # with the warm-up's, the shape's first runs
        served.submit(f"r{i}", f"r {i}", 60.0)
        run_until_idle(served, device, clock)
    assert len(served.timeliness.lateness) == 0
    served.submit("settled", "settled", 60.0)
    run_until_idle(served, device, clock)
    assert len(served.timeliness.lateness) == 1


def noisy_errors(served: BatchModel, clock: FakeClock, exact: int, slow: int) -> None:
    """Batches lately: `exact` ran as estimated, `slow` three times their estimate."""
    for ratio in [1.0] * exact + [3.0] * slow:
        served.costs.errors.observe(ratio, clock())
    served.costs.refresh_margins(clock())


async def test_a_margin_counts_the_batches_its_prediction_is_made_of_not_a_costlier_bucket_s():
    """Errors of n batches add up as sqrt(n): four 50 ms batches ahead and its own have a margin of
    ~0.22 s at a 2x excess. Taken on the costliest batch of any bucket (a long bucket's full batch of
    1.5 s, none of it waiting), the margin grew with the whole prediction (0.5 s) and refused requests
    with the time they needed (the issue's MiniLM case: 32-input batches that never formed, at 15 s)."""
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    served.costs.measured([(1, 32, 1.5)])  # a long bucket, nothing of it waiting
    for i in range(32 * 4):
        served.submit(f"r{i}", f"r {i}", 10.0)
    noisy_errors(served, clock, exact=10, slow=3)  # both percentiles 2x over
    assert served.costs.costliest_batch_s() == pytest.approx(1.5)
    admitted = served.submit("fits", "fits", 0.6)  # 250 ms predicted, ~220 ms margin
    assert admitted.predicted_start is not None
    assert admitted.predicted_start - clock() == pytest.approx(0.20, abs=0.01)  # after the four ahead
    with pytest.raises(ServiceOverloaded) as refused:
        served.submit("tight", "tight", 0.4)
    margin = re.search(r"plus a (\d+) ms margin", refused.value.message)
    assert margin is not None and 150 <= int(margin.group(1)) <= 260, refused.value.message


async def test_a_deadline_alone_is_refused_at_the_90th_percentile_of_errors_not_the_99th():
    """Two batches in thirty lately ran 3x their estimates: the 99th percentile's margin (~0.22 s here)
    would refuse a request with 0.4 s left for 0.25 s of predicted work; nine in ten batches run as
    estimated, so for its deadline it is admitted. A refusal for a deadline loses the request at once;
    an admitted one that misses gets its 504 by its deadline."""
    clock = FakeClock()
    served = model(clock, timeout_ms=10_000)
    FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32))
    for i in range(32 * 4):
        served.submit(f"r{i}", f"r {i}", 10.0)
    noisy_errors(served, clock, exact=30, slow=2)
    assert served.costs.margin_s(0.25, 0.05) > 0.15  # at the 99th: 0.25 + 0.22 > 0.4, refused
    admitted = served.submit("deadline", "deadline", 0.4)
    assert admitted.predicted_wait is not None and admitted.predicted_start is not None


@pytest.mark.parametrize("load", [1.2, 2.0])
async def test_under_an_objective_a_minority_bucket_is_refused_no_more_than_the_majority(load):
    """S10's mix on the fake clock: a tenth of the requests in a second length bucket. Judged by its own
    prediction, a request of the minority bucket (nothing waiting there: a batch of its own) was refused
    two to three times as often as one joining the majority's partial batch; judged alike, within 10
    points of each other, and every admitted request still meets the objective."""
    clock = FakeClock()
    served = model(clock, slo_ms=300, timeout_ms=2000)
    served.intake.prepare_one = lambda text: (text, int(len(text) > 50))  # (as S10's two_buckets backend)
    device = FakeDevice(served, clock, SimulatedGPU(latency_ms=50, max_batch_size=32, jitter=0.02, seed=5))
    rng = random.Random(17)
    sent, refused, admitted = {0: 0, 1: 0}, {0: 0, 1: 0}, []
    next_arrival, i, end = clock(), 0, clock() + 10.0
    while clock() < end:
        while next_arrival <= clock():
            long = rng.random() < 0.1
            text = f"a long input, well over fifty characters, in the second bucket {i}" if long else f"short {i}"
            sent[long] += 1
            try:
                admitted.append(served.submit(f"r{i}", text, 2.0))
            except ServiceOverloaded as error:
                assert error.reason == "slo_infeasible", error.message
                refused[long] += 1
            next_arrival += rng.expovariate(load * 640)
            i += 1
        device.step()
        clock.advance(0.0005)
    share = {bucket: refused[bucket] / sent[bucket] for bucket in (0, 1)}
    assert refused[0] and abs(share[1] - share[0]) <= 0.10, share
    done = [r for r in admitted if r.batch is not None and r.batch.finished_at]
    assert max(r.batch.finished_at - r.enqueued_at for r in done) <= 0.3
