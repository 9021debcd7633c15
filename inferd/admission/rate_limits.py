"""Per-tenant rate limits that follow the server's capacity.

One token bucket per (tenant, model). The configured rate is what a tenant gets when the model runs at
its full measured capacity; when capacity drops (a worker lost, a slower model), every budget for that
model shrinks in proportion, and grows back when capacity returns. Buckets refill lazily on use, so an
idle tenant costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ServerConfig
from ..errors import InvalidInput, RateLimited


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: a tenant (or the anonymous one) and its tier."""

    tenant: str
    tier: str
    rate_per_s: float | None = None  # the nominal budget: the tenant's own, else its tier's
    burst: float | None = None


class _Bucket:
    __slots__ = ("tokens", "updated")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.updated = now


class RateLimiter:
    """The token buckets of every (tenant, model), created on first use and refilled lazily."""

    def __init__(self, config: ServerConfig) -> None:
        self._tiers = {t.name: t for t in config.tiers}
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def identity(self, tenant: str, tier: str, rate_per_s: float | None = None, burst: float | None = None) -> Identity:
        """The identity with its effective nominal budget (tenant override, else the tier's)."""
        tier_config = self._tiers[tier]
        rate = rate_per_s if rate_per_s is not None else tier_config.rate_per_s
        size = burst if burst is not None else tier_config.burst
        if rate is not None and size is None:
            size = max(1.0, rate)
        return Identity(tenant, tier, rate, size)

    def check(self, who: Identity, model: str, capacity_scale: float, now: float, inputs: int = 1) -> None:
        """Take a token for each of a call's `inputs` or raise RateLimited with the wait until there are enough."""
        if who.rate_per_s is None:
            return
        rate = who.rate_per_s * capacity_scale
        burst = who.burst or 1.0
        if inputs > burst:
            raise InvalidInput(f"tenant {who.tenant} may send at most {burst:g} inputs at once to model {model}")
        key = (who.tenant, model)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(burst, now)
        else:
            bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
            bucket.updated = now
        if bucket.tokens >= inputs:
            bucket.tokens -= inputs
            return
        wait_s = (inputs - bucket.tokens) / rate if rate > 0 else 60.0
        retry_ms = max(1, math.ceil(wait_s * 1000))
        raise RateLimited(
            f"tenant {who.tenant} is over its limit of {rate:.3g} requests/s for model {model}",
            retry_after_ms=retry_ms,
        )

    def remaining(self, who: Identity, model: str, capacity_scale: float, now: float) -> float | None:
        """Tokens left now (without taking one); None when unlimited."""
        if who.rate_per_s is None:
            return None
        bucket = self._buckets.get((who.tenant, model))
        burst = who.burst or 1.0
        if bucket is None:
            return burst
        return min(burst, bucket.tokens + (now - bucket.updated) * who.rate_per_s * capacity_scale)
