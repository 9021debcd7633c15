"""The scheduling rule alone: due or not, and which bucket goes, on made-up bucket views."""

from __future__ import annotations

import math

import pytest

from inferd.scheduling.policy import BucketView, Limits, decide

LIMITS = Limits(max_batch_tokens=None, age_gap_s=0.1)
NOW = 100.0


def bucket(key: int, count: int, *, oldest_at: float = NOW, rank: float = 1, rank_oldest_at: float | None = None,
           deadline: float = math.inf, tokens: int | None = None, linger_s: float = 0.02, batch_s: float = 0.05,
           size_limit: int = 32, short_at: float = math.inf) -> BucketView:
    return BucketView(key, count, count if tokens is None else tokens, oldest_at, deadline, rank,
                      oldest_at if rank_oldest_at is None else rank_oldest_at, size_limit, batch_s, linger_s, short_at)


def go(*views: BucketView, now: float = NOW, rate: float = 1000.0, limits: Limits = LIMITS, **kw):  # type: ignore[no-untyped-def]
    decision = decide(views, now, limits, arrival_rate=rate, **kw)
    return (decision.bucket, decision.trigger) if decision.bucket is not None else (None, decision.due_at)


def test_a_lone_request_goes_at_once_when_the_linger_would_gather_nothing():
    assert go(bucket(0, 1), rate=8.0) == (0, "sparse")  # 8/s x 20 ms: 0.16 more expected
    assert go(bucket(0, 1), rate=0.0) == (0, "sparse")


def test_with_arrivals_coming_fast_the_linger_is_worth_it_until_its_tail():
    bucket_, due_at = go(bucket(0, 1), rate=1000.0)  # 20 more expected in the 20 ms
    assert bucket_ is None
    assert due_at == pytest.approx(NOW + 0.02 - 3.1 / 1000.0)  # the last 3.1 ms would gather too few
    assert go(bucket(0, 1), now=NOW + 0.019, rate=1000.0) == (0, "sparse")
    assert go(bucket(0, 1), now=NOW + 0.02, rate=1000.0, on_linger="idle_worker") == (0, "idle_worker")


def test_full_by_count_or_by_tokens():
    assert go(bucket(0, 32)) == (0, "full")
    assert go(bucket(0, 12, size_limit=12)) == (0, "full")  # the largest useful batch of a costly bucket
    budget = Limits(1000, 0.1)
    assert go(bucket(0, 5, tokens=1000), limits=budget) == (0, "full")
    assert go(bucket(0, 5, tokens=999), limits=budget)[0] is None


def test_a_deadline_it_would_miss_cuts_the_linger_short_one_it_cannot_meet_does_not():
    assert go(bucket(0, 1, deadline=NOW + 0.06, linger_s=1.0))[0] is None  # must start by NOW + 0.01
    assert go(bucket(0, 1, deadline=NOW + 0.06, linger_s=1.0), now=NOW + 0.011) == (0, "deadline")
    assert go(bucket(0, 1, deadline=NOW + 0.04, linger_s=1.0), now=NOW + 0.011)[0] is None  # lost anyway
    # what its batch costs decides when: a 10 ms batch may wait until 20 ms before its due (one batch's time
    # to spare for a batch in progress on the worker)
    assert go(bucket(0, 1, deadline=NOW + 0.06, linger_s=1.0, batch_s=0.01), now=NOW + 0.039)[0] is None
    assert go(bucket(0, 1, deadline=NOW + 0.06, linger_s=1.0, batch_s=0.01), now=NOW + 0.041) == (0, "deadline")
    # (with less than two batches' time when it came, it keeps what there is: it goes by its due less one)


def test_a_due_further_off_than_two_batches_leaves_a_batch_to_spare():
    """An objective of its own tighter than the bucket's linger (a higher tier's): the batch goes two batch
    times before that due, not one, so that the batch the worker may be running cannot make it late and
    admission can promise it with its margin."""
    roomy = bucket(0, 1, deadline=NOW + 0.6, linger_s=1.0, batch_s=0.11)
    assert go(roomy, now=NOW + 0.37, rate=1000.0)[0] is None
    assert go(roomy, now=NOW + 0.381, rate=1000.0) == (0, "deadline")  # 0.6 - 2 x 0.11


def test_the_earliest_due_goes_first_and_a_full_bucket_jumps_it_only_where_that_is_affordable():
    full = bucket(0, 32, oldest_at=NOW - 0.05)
    long = bucket(1, 3, oldest_at=NOW - 0.06, deadline=NOW + 0.09, batch_s=0.05)  # after the full one: NOW + 0.1
    assert go(full, long) == (1, "linger")
    roomy = bucket(1, 3, oldest_at=NOW - 0.06, deadline=NOW + 0.11, batch_s=0.05)  # it can afford the full batch
    assert go(full, roomy) == (0, "full")
    late = bucket(1, 3, oldest_at=NOW - 0.06, deadline=NOW + 0.04, batch_s=0.05)  # late whatever goes first
    assert go(full, late) == (1, "linger")  # the earliest due still goes first: late, not left to starve
    tight_full = bucket(0, 32, oldest_at=NOW - 0.04, deadline=NOW + 0.06)  # two partial buckets' dues, then a full one's
    assert go(tight_full, long) == (0, "full")  # its due is the earliest


def test_a_full_bucket_goes_first_unless_another_has_waited_longer_by_more_than_the_gap():
    full = bucket(0, 32, oldest_at=NOW - 0.05)
    partial = bucket(1, 3, oldest_at=NOW - 0.12)  # lingered: due, 70 ms older than the full one's head
    assert go(full, partial) == (0, "full")
    starving = bucket(1, 3, oldest_at=NOW - 0.2)  # 150 ms older: past the 100 ms gap
    assert go(full, starving) == (1, "linger")


def test_a_short_calls_bucket_goes_before_an_older_one_holding_only_large_calls_where_that_is_affordable():
    large = bucket(0, 32, oldest_at=NOW - 0.3)  # parts of large calls only, 250 ms older: past the age gap
    short = bucket(1, 32, oldest_at=NOW - 0.05, short_at=NOW - 0.01)
    assert go(large, short) == (1, "full")
    assert decide([large, short], NOW, LIMITS, arrival_rate=1000.0).short_jump
    assert go(large, short, short_jumps=False) == (0, "full")  # the batcher says half the recent batches jumped
    tight = bucket(0, 32, oldest_at=NOW - 0.3, deadline=NOW + 0.09)  # 50 ms after the short one's 50: late
    assert go(tight, short) == (0, "full")
    finishing = bucket(0, 32, oldest_at=NOW - 0.3, short_at=NOW - 0.2)  # the oldest finishes a short call itself
    assert go(finishing, short) == (0, "full")
    assert not decide([finishing, short], NOW, LIMITS, arrival_rate=1000.0).short_jump
    lingering = bucket(1, 3, oldest_at=NOW - 0.005, short_at=NOW - 0.005)  # not due yet: it is not a candidate
    assert go(large, lingering) == (0, "full")


def test_a_higher_tier_waits_behind_a_lower_tiers_full_batch_at_most_the_age_gap():
    free_full = bucket(0, 32, rank=1, oldest_at=NOW - 1.0)  # a deep free backlog
    enterprise = bucket(1, 2, rank=3, oldest_at=NOW - 0.03)  # due, its batch filling meanwhile
    assert go(free_full, enterprise) == (0, "full")
    waited = bucket(1, 12, rank=3, oldest_at=NOW - 0.101)  # waited the gap: the higher tier goes
    assert go(free_full, waited) == (1, "linger")
    enterprise_full = bucket(1, 32, rank=3, oldest_at=NOW - 0.01)
    assert go(free_full, enterprise_full) == (1, "full")  # a higher tier's full batch never waits
    free_partial = bucket(0, 5, rank=1, oldest_at=NOW - 0.5)
    assert go(free_partial, enterprise) == (1, "linger")  # nobody full: the higher tier
    # with an objective of its own the higher tier waits only where it still meets it after the full batch
    objective = bucket(1, 2, rank=3, oldest_at=NOW - 0.03, deadline=NOW + 0.11)  # its 50 ms batch by NOW + 0.06
    assert go(free_full, objective) == (0, "full")
    tight = bucket(1, 2, rank=3, oldest_at=NOW - 0.03, deadline=NOW + 0.09)  # after the full one's 50 ms: late
    assert go(free_full, tight) == (1, "linger")
    # not due yet (lingering to fill, 80 ms of its 1 s linger left), but due in the middle of the full batch
    lingering = bucket(1, 2, rank=3, oldest_at=NOW - 0.02, deadline=NOW + 0.09, linger_s=1.0)
    assert go(free_full, lingering, rate=0.0, hold_until=NOW + 1) == (1, "deadline")
    roomy = bucket(1, 2, rank=3, oldest_at=NOW - 0.02, deadline=NOW + 0.2, linger_s=1.0)  # due after it: it waits
    assert go(free_full, roomy, rate=0.0, hold_until=NOW + 1) == (0, "full")


def test_a_promoted_request_ranks_above_every_tier():
    enterprise_full = bucket(0, 32, rank=3)
    promoted = bucket(1, 1, rank=math.inf, oldest_at=NOW - 2.0)
    assert go(enterprise_full, promoted) == (1, "linger")


def test_during_an_echo_hold_nothing_is_sparse_and_the_linger_lasts_the_hold():
    held = go(bucket(0, 1, oldest_at=NOW - 0.05), rate=0.0, hold_until=NOW + 0.01)
    assert held == (None, NOW + 0.01)
    assert go(bucket(0, 1, oldest_at=NOW - 0.05), now=NOW + 0.01, rate=0.0, hold_until=NOW + 0.01) == (0, "linger")


def test_nothing_waiting_nothing_due():
    assert go() == (None, math.inf)
    assert go(bucket(0, 0)) == (None, math.inf)
