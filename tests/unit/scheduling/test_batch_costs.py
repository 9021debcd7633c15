"""The cost model on its own: learning a real model's curve (the variable-cost sim's formula) from the
batches that run, following a slowdown, the spread it keeps as slack, and the largest useful batch."""

from __future__ import annotations

import itertools
import random

import pytest

from inferd.backends.sim import SimulatedGPU
from inferd.scheduling.batch_costs import SETTLING_RUNS, BatchCosts
from inferd.scheduling.prediction_errors import MIN_EXCESS


def sim(**options: float) -> SimulatedGPU:
    """The variable-cost sim: its `call_s` is the truth the cost model learns (nothing is slept)."""
    return SimulatedGPU(**{"latency_ms": 5.0, "per_item_ms": 1.0, "per_token_ms": 0.05, "max_batch_size": 64, **options})


def texts(n: int, chars: int) -> list[str]:
    return ["x" * chars] * n


def test_nothing_measured_nothing_predicted_and_one_measurement_is_flat():
    costs = BatchCosts(32)
    assert costs.estimate(8, 0) == 0.0 and costs.curve(0) is None and costs.size_limit(0) == 32
    costs.measured([(0, 1, 0.05)])
    assert costs.estimate(1, 0) == costs.estimate(32, 0) == pytest.approx(0.05)  # the seed's function: flat
    assert costs.estimate(8, 3) == pytest.approx(0.05)  # a bucket never run borrows the nearest measured one


def test_the_curve_of_a_real_model_is_learned_from_the_batches_it_runs():
    clock = itertools.count(0.0, 0.05)  # when each batch ends: one every 50 ms
    device, costs = sim(), BatchCosts(64)
    for _ in range(5):
        for n in (1, 4, 16, 64):  # the sizes that happened to run, in two length buckets
            costs.observe(0, n, device.call_s(texts(n, 60)), next(clock))
            costs.observe(1, n, device.call_s(texts(n, 400)), next(clock))
    for n in (1, 2, 8, 10, 33, 50, 64):  # measured or not, every size is within 10% of the truth
        assert costs.estimate(n, 0) == pytest.approx(device.call_s(texts(n, 60)), rel=0.1)
        assert costs.estimate(n, 1) == pytest.approx(device.call_s(texts(n, 400)), rel=0.1)
    assert costs.estimate(64, 1) > 3 * costs.estimate(64, 0)  # long inputs cost more


def test_a_model_that_gets_twice_as_slow_is_followed_within_ten_batches_even_where_nothing_ran():
    clock = itertools.count(0.0, 0.05)  # when each batch ends: one every 50 ms
    device, costs = sim(), BatchCosts(64)
    for _ in range(30):  # served a while: batches of several sizes ran
        for n in (1, 8, 32, 64):
            costs.observe(0, n, device.call_s(texts(n, 60)), next(clock))
    before = {n: costs.estimate(n, 0) for n in (1, 8, 20, 64)}
    device.slowdown = 2.0
    for _ in range(10):  # only full batches run meanwhile
        costs.observe(0, 64, device.call_s(texts(64, 60)), next(clock))
    assert costs.estimate(64, 0) == pytest.approx(2 * before[64], rel=0.05)
    for n in (1, 8, 20):  # shapes that did not run moved with the level
        assert costs.estimate(n, 0) == pytest.approx(2 * before[n], rel=0.15)
    device.slowdown = 1.0
    for _ in range(10):
        costs.observe(0, 64, device.call_s(texts(64, 60)), next(clock))
    assert costs.estimate(20, 0) == pytest.approx(before[20], rel=0.15)  # and back


def test_noisy_batches_widen_the_slack_and_the_estimate_stays_at_the_mean():
    clock = itertools.count(0.0, 0.05)  # when each batch ends: one every 50 ms
    steady, noisy = BatchCosts(8), BatchCosts(8)
    rng = random.Random(1)
    for _ in range(300):
        steady.observe(0, 8, 0.05, next(clock))
        noisy.observe(0, 8, 0.05 * max(0.1, 1 + 0.2 * rng.gauss(0, 1)), next(clock))
    assert steady.slack == MIN_EXCESS  # never less than 10%
    assert 0.3 < noisy.slack < 0.8  # two standard deviations of a 20% jitter
    assert noisy.estimate(8, 0) == pytest.approx(0.05, rel=0.1)


def test_with_an_objective_the_batch_stops_at_the_largest_useful_size():
    costs = BatchCosts(64, slo_s=0.3)
    # throughput flattens past 16 (a CPU's curve): about 16 gets 95% of the best for a third of the latency
    costs.measured([(0, 1, 0.012), (0, 16, 0.047), (0, 32, 0.094), (0, 64, 0.180)])
    useful = costs.size_limit(0)
    best = max(n / costs.estimate(n, 0) for n in range(1, 65) if 2 * costs.estimate(n, 0) <= 0.3)  # fits the objective
    assert 12 <= useful <= 20 and useful / costs.estimate(useful, 0) >= 0.95 * best
    # long inputs: 64 of them would take 1.2 s; a batch past 8 would take over half the objective
    costs.measured([(1, 1, 0.03), (1, 8, 0.15), (1, 64, 1.2)])
    assert 4 <= costs.size_limit(1) <= 8
    flat = BatchCosts(64, slo_s=0.3)
    flat.measured([(0, 1, 0.05)])
    assert flat.size_limit(0) == 64  # the seed's function: the fuller the better
    assert BatchCosts(64).size_limit(0) == 64  # nothing measured: the largest allowed


def settled(costs: BatchCosts, shapes: list[tuple[int, int, float]]) -> BatchCosts:
    """`costs` with each (bucket, size, seconds) run `SETTLING_RUNS` times (its cell settled)."""
    costs.measured(shapes)
    for _ in range(SETTLING_RUNS - 1):
        for bucket, size, seconds in shapes:
            costs.observe(bucket, size, seconds, 1.0)
    return costs


CPU = [(0, 1, 0.0206), (0, 2, 0.0299), (0, 4, 0.0599), (0, 8, 0.1108), (0, 16, 0.2164), (0, 32, 0.4554),
       (0, 64, 1.0246)]  # a cross-encoder on two CPU cores: 128-token pairs at 1-64 a batch (measured)


def test_without_an_objective_the_batch_stops_where_throughput_stops_growing():
    """The cross-encoder on a CPU: past 16-32 a pair costs more, not less, and the batch running is what a
    newly arrived short call waits for. Without an objective nothing is traded for latency: where
    throughput keeps growing, the batch fills."""
    cpu = BatchCosts(64)
    cpu.measured(CPU)  # (at warm-up: from then on)
    curve = [0.0] + [cpu.estimate(n, 0) for n in range(1, 65)]
    best = max(n / curve[n] for n in range(1, 65))
    assert cpu.size_limit(0) == max(n for n in range(1, 65) if n / curve[n] >= 0.95 * best)
    assert 24 <= cpu.size_limit(0) <= 40 and cpu.estimate(cpu.size_limit(0), 0) < 0.6  # not 64's 1.02 s
    device = sim()  # 5 ms a call, 1 ms an input: the fuller, the more a second
    linear = BatchCosts(64)
    linear.measured([(0, n, device.call_s(texts(n, 60))) for n in (1, 2, 4, 8, 16, 32, 64)])
    assert linear.size_limit(0) == 64
    flat = BatchCosts(64)
    flat.measured([(0, 1, 0.05), (0, 64, 0.0502)])
    assert flat.size_limit(0) == 64


def test_beside_short_calls_a_batch_stops_at_the_smallest_size_with_95_percent_of_the_best_throughput():
    """Short calls beside large ones wait for the batch running. The cross-encoder on a CPU does 95% of
    its best at 6 pairs (86 ms) as at 32 (455 ms): beside short calls the batch stops at the smaller, or
    at an eighth of `max_batch_size` (8: 111 ms) where that is more, and every figure read from the limit
    follows; bulk work alone fills to the larger again."""
    cpu = BatchCosts(64)
    cpu.measured(CPU)
    curve = [0.0] + [cpu.estimate(n, 0) for n in range(1, 65)]
    best = max(n / curve[n] for n in range(1, 65))
    top, revision = cpu.size_limit(0), cpu.revision
    cpu.set_short_calls_beside_large(True)
    knee = max(64 // 8, min(n for n in range(1, 65) if n / curve[n] >= 0.95 * best))
    assert cpu.size_limit(0) == knee < top and cpu.estimate(knee, 0) < 0.12 and cpu.revision > revision
    assert cpu.full_batch_s(0) == cpu.estimate(knee, 0) == cpu.costliest_batch_s()
    cpu.set_short_calls_beside_large(False)
    assert cpu.size_limit(0) == top and cpu.costliest_batch_s() == cpu.estimate(top, 0)
    flat = BatchCosts(64)  # (a GPU's fixed time a call, the seed's function: a batch fills either way)
    flat.measured([(0, 1, 0.05), (0, 64, 0.0502)])
    flat.set_short_calls_beside_large(True)
    assert flat.size_limit(0) == 64
    per_pair = BatchCosts(64)  # (the same time a pair at every size: never below the floor)
    per_pair.measured([(0, 1, 0.016), (0, 64, 1.024)])
    per_pair.set_short_calls_beside_large(True)
    assert per_pair.size_limit(0) == 8
    steep = BatchCosts(64)  # (bulk work alone stops at 4: beside short calls, never larger than that)
    steep.measured([(0, 1, 0.010), (0, 4, 0.020), (0, 8, 0.080), (0, 64, 1.0)])
    steep.set_short_calls_beside_large(True)
    assert steep.size_limit(0) == 4
    with_objective = BatchCosts(64, slo_s=0.5)  # (an objective's own trade already is the smallest)
    with_objective.measured(CPU)
    limit = with_objective.size_limit(0)
    with_objective.set_short_calls_beside_large(True)
    assert with_objective.size_limit(0) == limit


def test_beside_short_calls_sizes_between_the_two_limits_still_teach_the_level():
    """Sizes up to the bulk limit are the ones that run; beside short calls those past the smaller limit
    are not stale probes (moved half way, teaching nothing else): the level learns from them as before."""
    cpu = settled(BatchCosts(64), CPU)
    cpu.set_short_calls_beside_large(True)
    level = cpu.level
    cpu.observe(0, 16, 0.2164 * 1.5, 2.0)
    assert cpu.level > level


def test_a_batch_past_the_limit_teaches_its_stale_cell_alone():
    """A probe past the limit (the batcher's, one batch in `PROBE_EVERY`) finds 64 faster than its
    cell says: the cell moves half way, the limit with it; neither the level nor a margin moves."""
    cpu = settled(BatchCosts(64), CPU)
    limit, level, slack = cpu.size_limit(0), cpu.level, cpu.slack
    cpu.observe(0, 64, 0.60, 2.0)  # (its cell: 1.02 s)
    assert cpu.estimate(64, 0) == pytest.approx((1.0246 + 0.60) / 2)
    assert cpu.level == level and cpu.slack == slack and cpu.size_limit(0) > limit


def test_the_useful_size_is_its_definition_on_any_measured_curve():
    """Found in one pass (the curve never falls), the size is the one its definition names: among the
    sizes whose batch takes at most half the objective, the smallest with 95% of their best throughput
    then every larger one costing at most 1% more than it; without an objective, the largest with 95%
    of the best."""
    rng = random.Random(5)
    for _ in range(400):
        slo_s = rng.choice([0.05, 0.2, 0.5, 2.0, None])
        costs = BatchCosts(32, slo_s=slo_s)
        sizes = sorted(rng.sample(range(1, 33), rng.randint(1, 6)))
        settled(costs, [(0, n, rng.uniform(0.001, 0.4)) for n in sizes])
        curve = [costs.estimate(n, 0) for n in range(33)]
        fits = [n for n in range(1, 33) if slo_s is None or 2 * curve[n] <= slo_s]
        if not fits:
            assert costs.size_limit(0) == 1
            continue
        best = max(n / curve[n] for n in fits)
        if slo_s is None:
            assert costs.size_limit(0) == max(n for n in fits if n / curve[n] >= 0.95 * best)
            continue
        knee = next(n for n in fits if n / curve[n] >= 0.95 * best)
        assert costs.size_limit(0) == max(n for n in fits if curve[n] <= curve[knee] * 1.01)


def test_a_larger_batch_is_never_predicted_cheaper_and_wrong_figures_are_ignored():
    costs = BatchCosts(16)
    costs.measured([(0, 4, 0.04), (0, 8, 0.03), (0, 0, 1.0), (0, 99, 1.0), (0, 2, -1.0)])
    curve = [costs.estimate(n, 0) for n in range(1, 17)]
    assert curve == sorted(curve) and costs.estimate(8, 0) == pytest.approx(0.04)
    assert costs.describe()["buckets"]["0"]["sizes"].keys() == {"4", "8"}


def test_one_slow_batch_of_a_size_never_run_does_not_shrink_the_useful_batch_for_good():
    """The audit's case: one batch of a new size, slowed a hundredfold (a stall, one odd input), once set
    that size's cell outright; the curve's floor made every larger size as costly, and the useful batch
    fell from 16 to 1, where no batch of that size ran again to correct it."""
    clock = itertools.count(0.0, 0.05)
    costs = BatchCosts(64, slo_s=0.3)
    costs.measured([(0, 1, 0.012), (0, 16, 0.047), (0, 32, 0.094), (0, 64, 0.180)])
    useful, prior = costs.size_limit(0), costs.estimate(12, 0)
    costs.observe(0, 12, 5.4, next(clock))
    assert costs.estimate(12, 0) <= 2 * prior  # within a factor of two of what the curve predicted
    assert costs.size_limit(0) >= useful - 4
    for _ in range(5):  # the size runs again as it should: its cell follows
        costs.observe(0, 12, prior, next(clock))
    assert costs.estimate(12, 0) == pytest.approx(prior, rel=0.25) and abs(costs.size_limit(0) - useful) <= 2


def test_one_outlier_moves_the_level_at_most_twofold_and_a_real_slowdown_is_still_followed():
    clock = itertools.count(0.0, 0.05)
    costs = BatchCosts(8)
    for _ in range(30):
        costs.observe(0, 8, 0.05, next(clock))
    costs.observe(0, 8, 5.0, next(clock))  # a hundred times its estimate, once
    assert costs.estimate(8, 0) < 0.05 * 1.3
    for _ in range(30):
        costs.observe(0, 8, 0.05, next(clock))
    assert costs.estimate(8, 0) == pytest.approx(0.05, rel=0.05)
    for _ in range(15):  # four times slower for good: followed within fifteen batches
        costs.observe(0, 8, 0.2, next(clock))
    assert costs.estimate(8, 0) == pytest.approx(0.2, rel=0.1)


def test_new_sizes_teach_their_own_cells_without_widening_the_margin_and_extrapolate_across_all_sizes():
    """MiniLM on long inputs beside a busy core: warm-up timed one input (194 ms); batches of 7 and 8 then
    ran at 0.80 and 1.10 s. Their first runs, far off the flat guess, once made the margin 5x every
    prediction (most requests refused with 10 s to spare), and the slope between 7 and 8 made 32 cost 8 s."""
    clock = itertools.count(0.0, 0.5)
    costs = BatchCosts(32)
    costs.measured([(0, 1, 0.194)])
    for _ in range(3):
        costs.observe(0, 7, 0.80, next(clock))
        costs.observe(0, 8, 1.10, next(clock))
    assert costs.slack == pytest.approx(MIN_EXCESS)  # settling cells are learning, not noise
    assert 3.5 < costs.estimate(32, 0) < 5.0  # the slope from 1 to 8, not from 7 to 8
