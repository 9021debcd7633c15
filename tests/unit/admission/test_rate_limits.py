"""Token buckets per tenant and model, scaled by capacity, taking one token per input."""

from __future__ import annotations

import pytest

from inferd.admission.rate_limits import RateLimiter
from inferd.config import ServerConfig, TierConfig
from inferd.errors import InvalidInput, RateLimited


@pytest.fixture
def limiter() -> RateLimiter:
    return RateLimiter(ServerConfig(tiers=(TierConfig("free", rate_per_s=10, burst=5),)))


def test_a_burst_then_the_rate(limiter):
    who = limiter.identity("t", "free")
    for _ in range(5):
        limiter.check(who, "m", 1.0, now=0.0)
    with pytest.raises(RateLimited) as refused:
        limiter.check(who, "m", 1.0, now=0.0)
    assert refused.value.retry_after_ms == 100  # one token every 0.1 s
    limiter.check(who, "m", 1.0, now=0.1)
    assert limiter.remaining(who, "m", 1.0, now=0.1) == pytest.approx(0.0)


def test_budgets_follow_capacity_and_are_per_tenant_and_model(limiter):
    a, b = limiter.identity("a", "free"), limiter.identity("b", "free")
    for _ in range(5):
        limiter.check(a, "m", 0.5, now=0.0)
    with pytest.raises(RateLimited) as refused:
        limiter.check(a, "m", 0.5, now=0.0)
    assert refused.value.retry_after_ms == 200  # half the capacity: half the rate
    limiter.check(b, "m", 0.5, now=0.0)  # another tenant's bucket
    limiter.check(a, "other", 0.5, now=0.0)  # another model's bucket


def test_a_call_of_several_inputs_takes_a_token_each(limiter):
    who = limiter.identity("t", "free")
    limiter.check(who, "m", 1.0, now=0.0, inputs=3)
    with pytest.raises(RateLimited):
        limiter.check(who, "m", 1.0, now=0.0, inputs=3)
    limiter.check(who, "m", 1.0, now=0.0, inputs=2)
    with pytest.raises(InvalidInput):  # more than the burst can never be admitted: a 400, not a 429
        limiter.check(who, "m", 1.0, now=100.0, inputs=6)


def test_unlimited_tenants_are_never_refused():
    limiter = RateLimiter(ServerConfig())
    who = limiter.identity("anonymous", "default")
    assert who.rate_per_s is None and limiter.remaining(who, "m", 1.0, 0.0) is None
    for _ in range(1000):
        limiter.check(who, "m", 1.0, now=0.0)
