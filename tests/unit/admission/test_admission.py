"""Admission's refusals and hand-over, against a stand-in model with the state admission reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferd.admission.admission import Admission, deadline_s
from inferd.admission.auth import Authenticator
from inferd.admission.rate_limits import RateLimiter
from inferd.config import ModelConfig, ServerConfig, TierConfig
from inferd.errors import Draining, InvalidInput, ModelUnavailable, NotReady, ServiceOverloaded
from inferd.execution.faults import BreakerState
from inferd.lifecycle import Lifecycle, Phase

TIERS = (TierConfig("paid", priority=1), TierConfig("free", max_predicted_wait_ms=100))


class StandInModel:
    """What admission reads of a batch model, set by each test."""

    def __init__(self, *, ready: bool = True, depth: int = 0) -> None:
        self.name = "m"
        self.config = ModelConfig(name="m", backend="x", max_input_chars=10, max_queue=5, timeout_ms=1000)
        self.breaker = SimpleNamespace(state=BreakerState.CLOSED, refusal_s=lambda now: self.unavailable)
        self.ready, self.pool = ready, SimpleNamespace(warmed=True)
        self.batcher = SimpleNamespace(depth=depth)
        self.late = False  # the model predicts that a new request would not finish in time
        self.submitted: list[tuple[str, str, float]] = []
        self.unavailable = None
        self.in_flight: set[str] = set()  # inputs a shortcut answers (cached, or being computed)
        self.abandoned: list[str] = []

    def capacity_scale(self) -> float:
        return 1.0

    def retry_after_ms(self, tier: str) -> int:
        return 7

    def shortcut(self, request_id: str, value: str, timeout_s: float, tier: str, tenant: str, use_cache: bool) -> str | None:
        return f"shared {request_id}" if value in self.in_flight else None

    def submit(self, request_id: str, value: str, timeout_s: float, tier: str, tenant: str) -> str:
        if self.late:
            raise ServiceOverloaded("late", retry_after_ms=7, reason="slo_infeasible")
        self.submitted.append((request_id, value, timeout_s))
        if value == "full":
            raise ServiceOverloaded("full", retry_after_ms=7)
        self.in_flight.add(value)
        return request_id

    def abandon(self, request: str) -> None:
        self.abandoned.append(request)


@pytest.fixture
def lifecycle() -> Lifecycle:
    lifecycle = Lifecycle()
    lifecycle.phase = Phase.SERVING
    return lifecycle


def admission(lifecycle: Lifecycle) -> Admission:
    config = ServerConfig(tiers=TIERS, auth=ServerConfig().auth)
    limiter = RateLimiter(config)
    return Admission(lifecycle, Authenticator(config, limiter), limiter, TIERS)


def who(admit: Admission, tier: str = "free"):  # type: ignore[no-untyped-def]
    return admit.limiter.identity("t", tier)


def test_an_admitted_input_is_handed_to_the_model_with_its_deadline(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    assert admit.admit(model, "r1", ("hello",), who(admit), None) == ["r1"]  # type: ignore[arg-type]
    assert admit.admit(model, "r2", ("hi",), who(admit), 300) == ["r2"]  # type: ignore[arg-type]
    assert model.submitted == [("r1", "hello", 1.0), ("r2", "hi", 0.3)]
    assert deadline_s(model.config, 10**9) == model.config.max_timeout_ms / 1000


def test_several_inputs_are_admitted_together_or_not_at_all(lifecycle):
    admit, model = admission(lifecycle), StandInModel(depth=3)
    assert admit.admit(model, "r", ("a", "b"), who(admit), None) == ["r.0", "r.1"]  # type: ignore[arg-type]
    with pytest.raises(ServiceOverloaded) as refused:
        admit.admit(model, "s", ("c", "d", "e"), who(admit), None)  # type: ignore[arg-type]
    assert refused.value.reason == "queue_full" and refused.value.retry_after_ms == 7
    assert len(model.submitted) == 2


def test_an_input_already_in_flight_rides_on_it_even_when_a_new_one_would_be_late(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    model.in_flight.add("x")
    model.late = True
    assert admit.admit(model, "r", ("x",), who(admit), None) == ["shared r"]  # type: ignore[arg-type]
    with pytest.raises(ServiceOverloaded):
        admit.admit(model, "s", ("y",), who(admit), None)  # type: ignore[arg-type]
    assert model.submitted == []


def test_a_repeated_input_in_one_call_rides_on_its_first_copy_and_a_refusal_withdraws_the_call(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    assert admit.admit(model, "r", ("a", "a", "b"), who(admit), None) == ["r.0", "shared r.1", "r.2"]  # type: ignore[arg-type]
    with pytest.raises(ServiceOverloaded):
        admit.admit(model, "s", ("a", "c", "full"), who(admit), None)  # type: ignore[arg-type]
    assert model.abandoned == ["shared s.0", "s.1"]  # what this call had admitted before the refusal


@pytest.mark.parametrize("change, error, reason", [
    (lambda lc, m: setattr(lc, "phase", Phase.DRAINING), Draining, "draining"),
    (lambda lc, m: setattr(m, "ready", False), NotReady, "not_ready"),
    (lambda lc, m: (setattr(m.breaker, "state", BreakerState.OPEN), setattr(m, "unavailable", 2.5)),
     ModelUnavailable, "breaker_open"),
])
def test_refusals_come_before_any_work_and_a_503_says_when_to_retry(lifecycle, change, error, reason):
    admit, model = admission(lifecycle), StandInModel()
    change(lifecycle, model)
    with pytest.raises(error) as refused:
        admit.admit(model, "r", ("x",), who(admit), None)  # type: ignore[arg-type]
    assert refused.value.reason == reason and not model.submitted
    if refused.value.status == 503:
        assert refused.value.retry_after_ms and refused.value.retry_after_ms > 0


def test_too_long_inputs_are_400_and_tiers_map_to_engine_priorities(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    with pytest.raises(InvalidInput):
        admit.admit(model, "r", ("x" * 11,), who(admit, "paid"), None)  # type: ignore[arg-type]
    assert admit.engine_priority == {"paid": -1, "free": 0} and not model.submitted
