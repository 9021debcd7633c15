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
