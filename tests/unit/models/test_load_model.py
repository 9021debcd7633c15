"""What a model's load predicts: batch time, capacity, predicted wait. Pure: reading changes nothing."""

from __future__ import annotations

import math

import pytest

from inferd.models.load_model import LoadModel


def test_the_first_observation_sets_the_batch_time_and_later_ones_move_it_gently():
    load = LoadModel(max_batch_size=100)
    assert load.batch_s == 0.0 and load.capacity_rps(healthy=1) == 0.0
    load.observe_batch(0.1)
    assert load.batch_s == 0.1
    load.observe_batch(0.2)
    assert load.batch_s == 0.1 + 0.2 * (0.2 - 0.1)


def test_capacity_scales_with_healthy_workers_and_reading_it_moves_no_reference():
    load = LoadModel(max_batch_size=100)
    load.observe_batch(0.1)
    assert load.capacity_rps(2) == 2000.0
    load.capacity_rps(8)  # a read: the reference rate limits scale against must not move
    assert load.peak_capacity_rps == 0.0 and load.capacity_scale(1) == 1.0
    load.note_capacity(2)
    assert load.peak_capacity_rps == 2000.0
    assert load.capacity_scale(1) == 0.5  # one of two workers lost: budgets halve


def test_predicted_wait_is_the_time_to_a_free_worker_plus_a_batch_per_full_round_ahead():
    load = LoadModel(max_batch_size=10)
    assert load.predicted_wait_s(ahead=0, healthy=1, first_free_s=0.0) == 0.0  # not measured yet, nothing ahead
    assert math.isinf(load.predicted_wait_s(ahead=5, healthy=1, first_free_s=0.0))
    load.observe_batch(0.1)
    assert load.predicted_wait_s(ahead=9, healthy=1, first_free_s=0.03) == 0.03  # fits the next batch
    assert load.predicted_wait_s(ahead=25, healthy=1, first_free_s=0.03) == 0.03 + 2 * 0.1
    assert load.predicted_wait_s(ahead=25, healthy=2, first_free_s=0.0) == 0.1
    assert math.isinf(load.predicted_wait_s(ahead=1, healthy=0, first_free_s=0.0))


def test_higher_tiers_taking_the_workers_time_stretch_the_wait_and_can_make_it_endless():
    load = LoadModel(max_batch_size=10)
    load.observe_batch(0.1)  # one batch: 100 ms
    for i in range(20):  # the top tier (rank 3) has been taking half of the worker's time lately
        load.observe_batch(0.1, size=10, backlog=5, by_rank={3: 10}, now=i * 0.2)
    share = load.share_above(rank=1, healthy=1, now=4.0)
    assert 0.4 < share < 0.6 and load.share_above(rank=3, healthy=1, now=4.0) == 0.0
    assert load.predicted_wait_s(ahead=20, healthy=1, first_free_s=0.0, share_above=0.5) == 4 * 0.1  # 5 a round
    assert math.isinf(load.predicted_wait_s(ahead=0, healthy=1, first_free_s=0.01, share_above=0.96))


def test_rounds_are_as_large_as_loaded_batches_have_been():
    load = LoadModel(max_batch_size=32)
    load.observe_batch(0.05)
    assert load.predicted_wait_s(ahead=64, healthy=1, first_free_s=0.0) == 2 * 0.05  # full batches assumed
    for _ in range(50):  # under load, batches of a second bucket went out with 8 while more waited
        load.observe_batch(0.05, size=8, backlog=100)
    assert load.loaded_batch == pytest.approx(8, abs=0.1)
    assert load.predicted_wait_s(ahead=64, healthy=1, first_free_s=0.0) == pytest.approx(7 * 0.05)  # int(64 / 8.0x)
    load.observe_batch(0.05, size=1, backlog=0)  # a batch taken with nothing left behind says nothing of capacity
    assert load.loaded_batch == pytest.approx(8, abs=0.1)


def test_the_linger_is_max_wait_or_what_the_objective_leaves_after_two_batches():
    load = LoadModel(max_batch_size=10)
    load.observe_batch(0.02)
    assert load.linger_s(max_wait_ms=5, slo_ms=None) == 0.005
    assert load.linger_s(max_wait_ms=5, slo_ms=100) == 0.1 - 2 * 0.02  # 60 ms: room for a longer linger
    assert load.linger_s(max_wait_ms=5, slo_ms=30) == 0.0  # the objective leaves none


def test_a_shared_batch_counts_each_tier_for_its_share_of_the_call():
    load = LoadModel(max_batch_size=10)
    for i in range(40):  # every 100 ms call holds 6 enterprise (rank 3) and 4 free (rank 1) requests
        load.observe_batch(0.1, size=10, backlog=50, by_rank={3: 6, 1: 4}, now=i * 0.1)
    assert load.share_above(rank=1, healthy=1, now=4.0) == pytest.approx(0.6, rel=0.1)
