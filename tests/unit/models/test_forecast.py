"""What a model's load predicts: waits from the work ahead by bucket, costed by the cost model; capacity;
the tiers' shares. Pure: reading changes nothing."""

from __future__ import annotations

import math

import pytest

from inferd.models.forecast import Forecast
from inferd.scheduling.batch_costs import BatchCosts


def forecast(max_batch_size: int = 10, **per_bucket: float) -> Forecast:
    """A forecast whose bucket N's batches cost `bN` seconds whatever their size."""
    costs = BatchCosts(max_batch_size)
    costs.measured([(int(name[1:]), 1, seconds) for name, seconds in per_bucket.items()])
    return Forecast(costs)


def test_the_first_observation_sets_the_mean_batch_time_and_later_ones_move_it_gently():
    f = forecast(100)
    assert f.batch_s == 0.0 and f.capacity_rps(healthy=1) == 0.0
    f.observe_batch(0.1)
    assert f.batch_s == 0.1
    f.observe_batch(0.2)
    assert f.batch_s == 0.1 + 0.2 * (0.2 - 0.1)


def test_capacity_scales_with_healthy_workers_and_reading_it_moves_no_reference():
    f = forecast(100)
    f.observe_batch(0.1)
    assert f.capacity_rps(2) == 2000.0
    f.capacity_rps(8)  # a read: the reference rate limits scale against must not move
    assert f.peak_capacity_rps == 0.0 and f.capacity_scale(1) == 1.0
    f.note_capacity(2)
    assert f.peak_capacity_rps == 2000.0
    assert f.capacity_scale(1) == 0.5  # one of two workers lost: budgets halve


def test_the_wait_is_the_time_to_a_free_worker_plus_the_batches_ahead():
    f = forecast(b0=0.1)
    assert f.wait_s({0: 9}, 0, healthy=1, first_free_s=0.03) == 0.03  # it joins the next batch
    assert f.wait_s({0: 25}, 0, healthy=1, first_free_s=0.03) == pytest.approx(0.03 + 2 * 0.1)
    assert f.wait_s({0: 25}, 0, healthy=2, first_free_s=0.0) == pytest.approx(0.1)
    assert math.isinf(f.wait_s({0: 1}, 0, healthy=0, first_free_s=0.0))
    assert f.wait_s({}, 0, healthy=0, first_free_s=0.0) == 0.0


def test_each_bucket_ahead_is_costed_by_its_own_batches_and_another_buckets_partial_batch_is_a_call():
    f = forecast(b0=0.01, b1=0.2)  # short inputs: 10 ms a batch; long ones: 200 ms
    # 15 short ahead of a short request: one full batch, then its own (with the other 5)
    assert f.wait_s({0: 15}, 0, healthy=1, first_free_s=0.0) == pytest.approx(0.01)
    # ...and 3 long ones waiting too: their (partial) batch is a whole call ahead of it
    assert f.wait_s({0: 15, 1: 3}, 0, healthy=1, first_free_s=0.0) == pytest.approx(0.01 + 0.2)
    # a long request joins the long partial batch: only the short work is ahead of it
    assert f.wait_s({0: 15, 1: 3}, 1, healthy=1, first_free_s=0.0) == pytest.approx(0.01 + 0.01)
    assert f.own_batch_s(3, 1) == pytest.approx(0.2)


def test_a_costly_curve_makes_a_fuller_batch_longer():
    costs = BatchCosts(10)
    costs.measured([(0, 1, 0.01), (0, 10, 0.1)])  # 10 ms a request
    f = Forecast(costs)
    assert f.own_batch_s(0, 0) == pytest.approx(0.01)  # alone
    assert f.own_batch_s(3, 0) == pytest.approx(0.04)  # the 4th of its batch
    assert f.own_batch_s(3, 0, joining=20) == pytest.approx(0.1)  # more coming before it is taken: full
    assert f.wait_s({0: 25}, 0, healthy=1, first_free_s=0.0) == pytest.approx(0.2)  # two full batches first


def test_higher_tiers_arriving_meanwhile_stretch_the_wait_and_can_make_it_endless():
    f = forecast(b0=0.1)
    # half of each batch goes to higher tiers' requests arriving meanwhile: 5 of 10 a round
    assert f.wait_s({0: 20}, 0, healthy=1, first_free_s=0.0, share_above=0.5) == pytest.approx(4 * 0.1)
    assert math.isinf(f.wait_s({0: 0}, 0, healthy=1, first_free_s=0.01, share_above=0.96))
    # at the tail: a burst of theirs (two standard deviations of a Poisson count) takes more rounds
    assert f.wait_s({0: 20}, 0, healthy=1, first_free_s=0.0, share_above=0.5, sigmas=2.0) == pytest.approx(6 * 0.1)


def test_a_higher_tiers_share_is_its_rate_at_full_batches_or_at_what_its_own_objective_lets_it_fill():
    f = forecast(b0=0.1)  # 100 ms a batch of up to 10
    f.batch_s = 0.1
    assert f.share_of(20.0, healthy=1) == pytest.approx(0.2)  # 2 batches of 10 a second
    assert f.share_of(20.0, healthy=2) == pytest.approx(0.1)
    assert f.share_of(20.0, healthy=1, fill_s=0.2) == pytest.approx(0.5)  # batches of 4: 5 a second
    assert f.share_of(20.0, healthy=1, fill_s=0.0) == pytest.approx(2.0)  # one at a time: more than the GPU has
    assert f.share_of(200.0, healthy=1, fill_s=0.2) == pytest.approx(2.0)  # it fills 10 anyway: full batches


def test_capacity_counts_batches_as_large_as_the_load_let_them_be():
    f = forecast(32)
    f.observe_batch(0.05)
    for _ in range(50):  # under load, batches went out with 8 while more waited
        f.observe_batch(0.05, size=8, backlog=100)
    assert f.loaded_batch == pytest.approx(8, abs=0.1)
    assert f.capacity_rps(1) == pytest.approx(8 / 0.05, rel=0.02)
    f.observe_batch(0.05, size=1, backlog=0)  # a batch taken with nothing left behind says nothing of capacity
    assert f.loaded_batch == pytest.approx(8, abs=0.1)


def test_the_linger_is_max_wait_or_what_the_objective_leaves_after_two_of_that_buckets_batches():
    f = forecast(b0=0.02, b1=0.04)
    assert f.linger_s(max_wait_ms=5, slo_ms=None) == 0.005
    assert f.linger_s(max_wait_ms=5, slo_ms=100) == pytest.approx(0.1 - 2 * 0.022)  # 56 ms (10% slack) to fill a batch
    assert f.linger_s(max_wait_ms=5, slo_ms=100, bucket=1) == pytest.approx(0.1 - 2 * 0.044)  # longer inputs: less
    assert f.linger_s(max_wait_ms=5, slo_ms=30) == 0.0  # the objective leaves none


def test_an_own_batch_never_counts_more_joiners_than_the_largest_batch_of_its_bucket_that_ran():
    """8 closed-loop clients echoing a 3 s batch: the arrival rate read right after a burst (8 a second)
    times a 1.7 s wait once priced a 14-input batch that could never form."""
    costs = BatchCosts(32)
    costs.measured([(5, 1, 0.78), (5, 8, 3.4)])
    f = Forecast(costs)
    assert f.own_batch_s(0, 5, joining=8 * 1.7) == pytest.approx(3.4)  # the 8 that ran, not 14
    assert f.own_batch_s(0, 5, joining=3.0) == pytest.approx(costs.estimate(4, 5))  # fewer: as expected


def test_an_own_batch_is_its_definition_for_every_count_ahead_and_joiners():
    """max(holds, min(holds + int(joining), the largest measured or the size limit)), for each case."""
    costs = BatchCosts(16)
    costs.measured([(0, 1, 0.05), (0, 6, 0.08), (1, 1, 0.1), (1, 16, 0.4)])
    f = Forecast(costs)
    for bucket in (0, 1, 2):  # (2: never measured, it borrows)
        size = costs.size_limit(bucket)
        largest = costs.largest_measured(bucket) or size
        for ahead in range(0, 40):
            for joining in (0.0, 0.4, 0.999, 1.0, 1.5, 3.2, 7.0, 15.9, 40.0):
                holds = ahead % size + 1
                holds = max(holds, min(holds + int(joining), largest))
                expected = (costs.full_batch_s(bucket) or f.batch_s) if holds >= size else f.batch_cost_s(holds, bucket)
                assert f.own_batch_s(ahead, bucket, joining) == expected, (bucket, ahead, joining)


@pytest.mark.parametrize("share_above, sigmas", [(0.0, 0.0), (0.3, 0.0), (0.3, 2.3)])
def test_the_wait_beside_the_wait_as_a_batch_of_its_own_are_each_call_s_own_number(share_above, sigmas):
    """Admission asks one pass for both (its bucket's partial batch its own, and a whole call): each is
    the very number its own call gives, not one within rounding of it."""
    costs = BatchCosts(8)
    costs.measured([(0, 1, 0.011), (0, 8, 0.047), (1, 1, 0.031), (1, 8, 0.093)])
    f = Forecast(costs)
    for ahead in ({0: 3}, {0: 3, 1: 5}, {0: 17, 1: 0}, {0: 8, 1: 9}, {1: 2, 0: 21}):
        for bucket in (0, 1):
            joined, alone = f.waits_s(ahead, bucket, 1, 0.013, share_above, sigmas, True)
            assert joined == f.wait_s(ahead, bucket, 1, 0.013, share_above, sigmas)
            assert alone == f.wait_s(ahead, None, 1, 0.013, share_above, sigmas)
            assert alone >= joined


def test_the_linger_under_an_objective_follows_every_change_of_the_cost_model():
    """Made once a revision of the cost model (it is read per decision): each batch that moves an
    estimate, or a margin fading, moves it too."""
    costs = BatchCosts(8, slo_s=1.0)
    f = Forecast(costs)

    def expected() -> float:
        return max(0.0, 1.0 - 2 * (costs.estimate(costs.size_limit(0), 0) or f.batch_s) * (1.0 + costs.slack))

    assert f.linger_s(10.0, None) == 0.01 and f.linger_s(10.0, 1000.0) == 1.0  # nothing measured yet
    f.observe_batch(0.2)  # (no size: the mean batch time alone, read while nothing is measured)
    assert f.linger_s(10.0, 1000.0) == expected() < 1.0
    seen = []
    for i, seconds in enumerate((0.1, 0.1, 0.1, 0.1, 0.3, 0.3, 0.3)):
        f.observe_batch(seconds, 8, 0, at=float(i))
        seen.append(f.linger_s(10.0, 1000.0))
        assert seen[-1] == expected()
    costs.refresh_margins(120.0)  # two minutes on: the margins have faded
    assert f.linger_s(10.0, 1000.0) == expected()
    assert len(set(seen)) > 2
