"""The records of the data path: a batch's Server-Timing for each of its requests."""

from __future__ import annotations

import asyncio

from inferd.messages import Batch, PendingRequest


def test_each_request_of_a_batch_gets_its_own_queue_time_and_the_batch_s_compute_time():
    loop = asyncio.new_event_loop()
    try:
        requests = [PendingRequest(f"r{i}", "x", 10.0 + i * 0.0012345, 20.0, loop.create_future()) for i in range(3)]
        batch = Batch(1, requests, "full", 10.01)
        batch.started_at, batch.finished_at = 10.0104567, 10.0206789
        late = PendingRequest("rider", "x", 10.05, 20.0, loop.create_future())  # attached while the batch ran
        timings = [batch.timing(r) for r in (*requests, late)]
    finally:
        loop.close()
    assert timings == [f"queue;dur={(10.0104567 - r.enqueued_at) * 1000:.3f}, compute;dur={(10.0206789 - 10.0104567) * 1000:.3f}"
                       for r in requests] + [f"queue;dur=0.000, compute;dur={(10.0206789 - 10.0104567) * 1000:.3f}"]
    assert timings[0] == "queue;dur=10.457, compute;dur=10.222"
