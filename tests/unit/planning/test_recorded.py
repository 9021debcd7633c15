"""`inferd plan` on a recorded day: arrivals from access-log lines, a device from a model's measured cost
curve (the whole chain from what a live server wrote: tests/e2e/test_plan_replica.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from inferd.planning.recorded import MeasuredDevice, arrivals_from_access_log, model_from_description


def line(ts: str, latency_ms: float, model: str = "m", status: int = 200) -> str:
    return json.dumps({"ts": ts, "request_id": "r", "model": model, "tier": "free", "status": status, "latency_ms": latency_ms})


def test_a_recorded_arrival_is_the_lines_end_less_its_latency_in_arrival_order():
    lines = [line("2026-11-29T10:00:01.000Z", 500.0),  # arrived at 00.500
             line("2026-11-29T10:00:00.300Z", 100.0),  # arrived at 00.200: first, though logged second
             line("2026-11-29T10:00:02.000Z", 10.0, model="other"),
             "not json", json.dumps({"event": "started"}),  # (lines that are not a request's)
             line("2026-11-29T10:00:03.250Z", 50.0)]  # 03.200
    arrivals = arrivals_from_access_log(lines, "m")
    assert [round(a.at, 6) for a in arrivals] == [0.0, 0.3, 3.0]
    assert len(arrivals_from_access_log(lines)) == 4  # (no model named: every request)


def test_a_sampled_log_stands_for_the_requests_it_did_not_write():
    lines = [line(f"2026-11-29T10:00:{s:02d}.000Z", 0.0) for s in range(50)]
    arrivals = arrivals_from_access_log(lines, "m", sample_rate=0.1)
    assert 480 <= len(arrivals) <= 520 and arrivals[-1].at <= 50.0  # ~10 a line, within the second around it


def test_the_measured_device_reads_the_cost_curve_as_the_cost_model_does():
    device = MeasuredDevice({0: ((1, 0.010), (8, 0.024)), 1: ((4, 0.050),)})
    assert device(1, 0) == 0.010 and device(0, 0) == 0.010  # (flat below the first size)
    assert device(4, 0) == pytest.approx(0.016)  # straight between two
    assert device(15, 0) == pytest.approx(0.038)  # past the last, the first-to-last slope
    assert device(16, 1) == 0.050 and device(3, 7) == pytest.approx(0.014)  # one size: flat; an unmeasured bucket: 0's


def test_a_model_description_without_a_batch_measured_cannot_be_planned_with():
    with pytest.raises(ValueError, match="no batch"):
        model_from_description({"name": "m", "max_batch_size": 8, "max_wait_ms": 5, "slo_ms": None, "timeout_ms": 1000,
                                "cost_model": {"buckets": {"0": {"size_limit": 8, "sizes": {}}}}})


def test_a_line_no_request_could_have_written_is_skipped_and_counted_by_reason():
    good = [line(f"2026-11-29T10:{m:02d}:00.000Z", 20.0) for m in range(60)]
    bad = [line("2026-11-29T10:30:00.000Z", float("nan")), line("2026-11-29T10:30:00.000Z", -86_400_000.0),
           line("2026-11-29T10:30:00.000Z", 4_000_000.0), json.dumps({"ts": "2026-11-29", "latency_ms": "5"}),
           json.dumps({"ts": "yesterday", "latency_ms": 5}), line("1970-01-01T00:00:00.000Z", 5.0)]
    skipped: Counter[str] = Counter()
    arrivals = arrivals_from_access_log(good + bad, None, skipped=skipped)
    assert len(arrivals) == 60 and arrivals[-1].at == pytest.approx(59 * 60.0)  # the hour, not 56 years nor a day
    assert skipped == {"latency": 4, "timestamp": 1, "far from the rest": 1}
