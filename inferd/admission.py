"""Admission: whether a request may enter a model's queue, and on what deadline.

Every refusal happens here, before any work, cheapest check first: draining, input too long, breaker
open, not ready, the tenant's rate limit (429), then shedding by predicted wait. A request that cannot
finish before its own deadline is refused at once rather than queued to die; past its tier's
`max_predicted_wait_ms` a lower tier is refused while a higher one still gets in. A 503 always carries
`retry_after_ms`. Admitted inputs are handed to the model (prepared, then queued).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from .config import TierConfig
from .errors import Draining, InvalidInput, ModelUnavailable, NotReady, ServiceOverloaded
from .faults import BreakerState
from .lifecycle import Lifecycle
from .messages import PendingRequest
from .rate_limits import Identity, RateLimiter
from .served_model import ServedModel

_CLOSED = BreakerState.CLOSED


class Admission:
    def __init__(self, lifecycle: Lifecycle, limiter: RateLimiter, tiers: tuple[TierConfig, ...]) -> None:
        self.lifecycle = lifecycle
        self.limiter = limiter
        self.tier_priorities = {t.name: t.priority for t in tiers}
        self.tier_wait_limit_s = {
            t.name: t.max_predicted_wait_ms / 1000.0 if t.max_predicted_wait_ms else None for t in tiers
        }

    def check_open(self) -> None:
        if self.lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)

    def admit(
        self, model: ServedModel, request_id: str, value: str, who: Identity, timeout_ms: int | None
    ) -> PendingRequest:
        """Admit one input to `model`: every check, then hand it over. The caller awaits `.future`."""
        if len(value) > model.config.max_input_chars:
            raise self._too_long(model, len(value))
        timeout_s = self._check(model, who, timeout_ms, 1)
        return model.submit(request_id, value, timeout_s, who.tier, who.tenant)

    def admit_many(
        self, model: ServedModel, request_id: str, values: Sequence[Any], who: Identity, timeout_ms: int | None
    ) -> list[PendingRequest]:
        """Admit several inputs of one call (e.g. `/v1/embeddings`) together: all of them or none. Each is
        batched like a request of its own; rate limits count each one."""
        limit = model.config.max_input_chars
        for value in values:
            if len(value) > limit:
                raise self._too_long(model, len(value))
        timeout_s = self._check(model, who, timeout_ms, len(values))
        if model.batcher.depth + len(values) > model.config.max_queue:
            raise ServiceOverloaded(
                f"model {model.name} cannot queue {len(values)} more inputs", retry_after_ms=model.retry_after_ms(who.tier),
                reason="queue_full",
            )
        return [model.submit(f"{request_id}.{i}", v, timeout_s, who.tier, who.tenant) for i, v in enumerate(values)]

    def _check(self, model: ServedModel, who: Identity, timeout_ms: int | None, count: int) -> float:
        """Every refusal that needs no work on the input; returns the deadline in seconds."""
        if self.lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)
        now = time.monotonic()
        if model.breaker.state is not _CLOSED:
            unavailable_s = model.unavailable_for_s(now)
            if unavailable_s is not None:
                raise ModelUnavailable(
                    f"model {model.name} is failing; its circuit breaker is open",
                    retry_after_ms=math.ceil(unavailable_s * 1000),
                    reason="breaker_open",
                )
        if not model.ready:
            state = "has no healthy worker" if model.warmed else "is warming up"
            raise NotReady(f"model {model.name} {state}", retry_after_ms=1000)
        config = model.config
        timeout_s = (config.timeout_ms if timeout_ms is None else min(timeout_ms, config.max_timeout_ms)) / 1000.0
        if who.rate_per_s is not None:  # (measuring capacity costs a little: only for limited callers)
            self.limiter.check(who, model.name, model.capacity_scale(), now, count)
        self._shed_by_predicted_wait(model, who.tier, timeout_s, now)
        return timeout_s

    @staticmethod
    def _too_long(model: ServedModel, length: int) -> InvalidInput:
        return InvalidInput(f"input is {length} characters; model {model.name} accepts at most {model.config.max_input_chars}")

    def _shed_by_predicted_wait(self, model: ServedModel, tier: str, timeout_s: float, now: float) -> None:
        wait_s = model.predicted_wait_s(tier, now)
        limit_s = self.tier_wait_limit_s.get(tier)
        compute_s = model.compute_ewma_s
        if wait_s + compute_s <= timeout_s and (limit_s is None or wait_s <= limit_s):
            return
        retry_ms = max(1, min(60_000, math.ceil(wait_s * 1000))) if not math.isinf(wait_s) else 1000
        if wait_s + compute_s > timeout_s:
            raise ServiceOverloaded(
                f"predicted wait {wait_s * 1000:.0f} ms plus {compute_s * 1000:.0f} ms of compute "
                f"exceeds this request's {timeout_s * 1000:.0f} ms deadline",
                retry_after_ms=retry_ms,
                reason="deadline_infeasible",
            )
        raise ServiceOverloaded(
            f"predicted wait {wait_s * 1000:.0f} ms is over the {tier} tier's {limit_s * 1000:.0f} ms",  # type: ignore[operator]
            retry_after_ms=retry_ms,
            reason="tier_predicted_wait",
        )
