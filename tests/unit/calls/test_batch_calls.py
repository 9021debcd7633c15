"""What a multi-input call's answer says of its timing."""

from inferd.calls.batch_calls import call_timing
from inferd.messages import Batch, PendingRequest


def test_a_call_split_over_two_batches_reads_the_queue_and_compute_of_its_input_answered_last():
    """Its first input ran in a long batch, its second waited for it and ran in a short one. The largest
    queue and the largest compute, taken apart, came from different batches and added up to 0.9 s of a
    0.6 s call; the input answered last reads 0.5 s of queue and 0.1 s of compute."""
    first, second = (PendingRequest(f"c.{i}", i, 9.9, 100.0, None, call_id="c", call_size=2) for i in range(2))  # type: ignore[arg-type]
    long_batch, short_batch = Batch(1, [first], "full", 10.0), Batch(2, [second], "full", 10.4)
    long_batch.started_at, long_batch.finished_at = 10.0, 10.4
    short_batch.started_at, short_batch.finished_at = 10.4, 10.5
    first.batch, second.batch = long_batch, short_batch
    assert call_timing([first, second], 0.6) == "total;dur=600.000, queue;dur=500.000, compute;dur=100.000"
    assert call_timing([second, first], 0.6) == call_timing([first, second], 0.6)


def test_a_call_of_one_input_reads_its_batch_or_says_the_cache_answered_it():
    from inferd.messages import RequestState

    computed, cached, shared = (PendingRequest(f"c.{i}", i, 9.9, 100.0, None) for i in range(3))  # type: ignore[arg-type]
    batch = Batch(1, [computed], "full", 10.0)
    batch.started_at, batch.finished_at = 10.05, 10.25
    computed.batch, computed.enqueued_at = batch, 10.0
    cached.state = RequestState.CACHED
    assert call_timing([computed], 0.3) == "total;dur=300.000, queue;dur=50.000, compute;dur=200.000"
    assert call_timing([cached], 0.001) == 'total;dur=1.000, cache;desc="hit 1 of 1"'
    assert call_timing([shared], 0.2) == "total;dur=200.000"  # (answered by another's computation: neither)
