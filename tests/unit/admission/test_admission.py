"""Admission's refusals and its one question to a model, against a stand-in with a batch model's face."""

from __future__ import annotations

import pytest

from inferd.admission.admission import Admission, timeout_s
from inferd.admission.auth import Authenticator
from inferd.admission.rate_limits import RateLimiter
from inferd.config import ModelConfig, ServerConfig, TierConfig
from inferd.errors import Draining, InferdError, InvalidInput, ModelUnavailable, NotReady, RateLimited
from inferd.lifecycle import Lifecycle, Phase

TIERS = (TierConfig("paid", priority=1), TierConfig("free", rate_per_s=1, burst=1))


class StandInModel:
    """A batch model's face, as admission sees it: its config, why it is unavailable, and `take`."""

    def __init__(self) -> None:
        self.name = "m"
        self.config = ModelConfig(name="m", backend="x", max_input_chars=10, max_queue=5, timeout_ms=1000)
        self.refusal: InferdError | None = None
        self.taken: list[tuple[str, tuple[str, ...], float, str]] = []

    def unavailable(self, now: float) -> InferdError | None:
        return self.refusal

    def capacity_scale(self) -> float:
        return 1.0

    def take(self, request_id: str, values, timeout_s: float, tier: str, tenant: str, use_cache: bool,  # type: ignore[no-untyped-def]
             client=None) -> list[str]:
        self.taken.append((request_id, tuple(values), timeout_s, tier))
        return [f"{request_id}.{i}" for i in range(len(values))]


@pytest.fixture
def lifecycle() -> Lifecycle:
    lifecycle = Lifecycle()
    lifecycle.phase = Phase.SERVING
    return lifecycle


def admission(lifecycle: Lifecycle) -> Admission:
    config = ServerConfig(tiers=TIERS, auth=ServerConfig().auth)
    limiter = RateLimiter(config)
    return Admission(lifecycle, Authenticator(config, limiter), limiter, TIERS)


def who(admit: Admission, tier: str = "paid"):  # type: ignore[no-untyped-def]
    return admit.limiter.identity("t", tier)


def test_an_admitted_call_is_handed_to_the_model_with_its_deadline_and_tier(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    assert admit.admit(model, "r1", ("hello",), who(admit), None) == ["r1.0"]  # type: ignore[arg-type]
    assert admit.admit(model, "r2", ("hi", "there"), who(admit), 300) == ["r2.0", "r2.1"]  # type: ignore[arg-type]
    assert model.taken == [("r1", ("hello",), 1.0, "paid"), ("r2", ("hi", "there"), 0.3, "paid")]
    assert timeout_s(model.config, 10**9) == model.config.max_timeout_ms / 1000


@pytest.mark.parametrize("change, error, reason", [
    (lambda lc, m: setattr(lc, "phase", Phase.DRAINING), Draining, "draining"),
    (lambda lc, m: setattr(m, "refusal", NotReady("warming up", retry_after_ms=1000)), NotReady, "not_ready"),
    (lambda lc, m: setattr(m, "refusal", ModelUnavailable("failing", retry_after_ms=2500, reason="breaker_open")),
     ModelUnavailable, "breaker_open"),
])
def test_refusals_come_before_any_work_and_a_503_says_when_to_retry(lifecycle, change, error, reason):
    admit, model = admission(lifecycle), StandInModel()
    change(lifecycle, model)
    with pytest.raises(error) as refused:
        admit.admit(model, "r", ("x",), who(admit), None)  # type: ignore[arg-type]
    assert refused.value.reason == reason and not model.taken
    assert refused.value.retry_after_ms and refused.value.retry_after_ms > 0


def test_too_long_inputs_are_400_a_tenant_over_its_rate_is_429_and_tiers_map_to_engine_priorities(lifecycle):
    admit, model = admission(lifecycle), StandInModel()
    with pytest.raises(InvalidInput):
        admit.admit(model, "r", ("x" * 11,), who(admit), None)  # type: ignore[arg-type]
    admit.admit(model, "r", ("x",), who(admit, "free"), None)  # type: ignore[arg-type]
    with pytest.raises(RateLimited):
        admit.admit(model, "s", ("y",), who(admit, "free"), None)  # type: ignore[arg-type]
    assert admit.engine_priority == {"paid": -1, "free": 0} and len(model.taken) == 1
