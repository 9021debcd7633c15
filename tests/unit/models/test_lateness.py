"""How late recent answers came, the bound on admission's margin: none until enough answers say so, then
the latest of the window, and answers older than the window no longer count."""

from __future__ import annotations

import math

from inferd.models.lateness import REMADE_S, SAMPLES, WINDOW_S, Lateness


def test_no_bound_until_enough_answers_then_the_latest_of_them_at_least_zero():
    lateness = Lateness()
    for i in range(SAMPLES - 1):
        lateness.observe(0.1 * i, 0.0)
    assert lateness.bound_s(0.0) == math.inf
    lateness.observe(-0.5, 0.0)
    assert lateness.bound_s(0.0) == 0.1 * (SAMPLES - 2)
    early = Lateness()
    for _ in range(SAMPLES):
        early.observe(-0.2, 0.0)  # every answer before its prediction
    assert early.bound_s(0.0) == 0.0


def test_answers_older_than_the_window_no_longer_count():
    lateness = Lateness()
    lateness.observe(4.0, 0.0)  # the onset: one answer 4 s late
    for i in range(SAMPLES):
        lateness.observe(0.3, 5.0 + i)
    assert lateness.bound_s(5.0 + SAMPLES) == 4.0
    assert lateness.bound_s(WINDOW_S + REMADE_S + 0.5) == 0.3  # the onset has left the window
