"""What every handler does last: an answer counted (by model, version, tier, status, code), its
objective met or missed, a refusal counted by reason (an evicted request as shed), and the access log asked."""

from __future__ import annotations

from types import SimpleNamespace

from inferd.errors import DeadlineExceeded, ServiceOverloaded
from inferd.observability.access_log import AccessLog
from inferd.observability.metrics import RequestMetrics
from inferd.observability.outcomes import Call, Outcomes


def test_outcomes_count_answers_and_refusals_by_reason():
    metrics = RequestMetrics()
    outcomes = Outcomes(metrics, AccessLog("off", 0.0))
    outcomes.record(Call(0.0, "r1", tier="free", model="m"))
    outcomes.record_error(Call(0.0, "r2", tier="free", model="m"), ServiceOverloaded("full", retry_after_ms=5, reason="queue_full"))
    outcomes.record_error(Call(0.0, "r3", tier="free", model="m"), ServiceOverloaded("room", reason="shed_for_higher_tier"))
    assert metrics.requests == {("m", "", "free", 200, ""): 1, ("m", "", "free", 503, "SERVICE_OVERLOADED"): 2}
    assert metrics.refused == {("m", "free", "queue_full"): 1}
    assert metrics.shed == {("m", "free", "for_higher_tier"): 1}  # (evicted from the queue: shed, not refused)
    assert metrics.duration["m"].count == 3


def test_an_admitted_requests_objective_is_met_or_missed_and_a_refused_one_is_neither(monkeypatch):
    metrics = RequestMetrics()
    outcomes = Outcomes(metrics, AccessLog("off", 0.0))
    monkeypatch.setattr("inferd.observability.outcomes.time.monotonic", lambda: 10.0)
    on_time = SimpleNamespace(slo_at=10.5, enqueued_at=9.9, batch=None)
    late = SimpleNamespace(slo_at=9.5, enqueued_at=9.0, batch=None)
    outcomes.record(Call(9.8, "a", None, "free", "-", "m", "1", [on_time]))  # type: ignore[list-item]
    outcomes.record(Call(8.9, "b", None, "free", "-", "m", "1", [late]))  # type: ignore[list-item]
    two = [SimpleNamespace(slo_at=9.0, enqueued_at=8.5, batch=None)] * 2  # (a call of two inputs: one objective)
    outcomes.record_error(Call(8.0, "c", None, "free", "-", "m", "1", two), DeadlineExceeded("late"))  # type: ignore[arg-type]
    outcomes.record_error(Call(9.9, "d", tier="free", model="m", version="1"), ServiceOverloaded("no", reason="slo_infeasible"))
    assert dict(metrics.objectives) == {("m", "1", "free", "met"): 1, ("m", "1", "free", "missed"): 2}
    assert dict(metrics.refused) == {("m", "free", "slo_infeasible"): 1} and not metrics.shed  # (refused at once)


def test_without_metrics_an_answer_is_still_logged_when_the_log_wants_it(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="inferd.access"):
        Outcomes(None, AccessLog("info", 0.0)).record(Call(0.0, "r9", tier="free", model="m"), 500, "INFERENCE_FAILED")
    assert '"request_id":"r9"' in caplog.records[-1].getMessage()
