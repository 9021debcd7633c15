"""What a model's load predicts: batch time, capacity, predicted wait. Pure: reading changes nothing."""

from __future__ import annotations

import math

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
