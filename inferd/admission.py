"""Admission: whether a parsed request may enter a model's queue, and on what deadline.

Every refusal happens here, before any work, cheapest check first: draining, input too long, breaker
open, not ready, the tenant's rate limit (429), then shedding by predicted wait. A request that cannot
finish before its own deadline is refused at once rather than queued to die; past its tier's
`max_predicted_wait_ms` a lower tier is refused while a higher one still gets in. A 503 always carries
`retry_after_ms`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .batcher import QueueFull
from .config import TierConfig
from .errors import Draining, InvalidInput, ModelUnavailable, NotReady, ServiceOverloaded
from .lifecycle import Lifecycle
from .messages import PendingRequest
from .protocol import InferenceCall
from .rate_limits import Identity, RateLimiter
from .served_model import ServedModel


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

    def check(self, model: ServedModel, call: InferenceCall, who: Identity) -> float:
        """Every refusal that needs no work on the input; returns the request's timeout in seconds."""
        self.check_open()
        config = model.config
        if len(call.input) > config.max_input_chars:
            raise InvalidInput(
                f"`input` is {len(call.input)} characters; model {model.name} accepts at most {config.max_input_chars}"
            )
        now = time.monotonic()
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
        timeout_ms = config.timeout_ms if call.timeout_ms is None else min(call.timeout_ms, config.max_timeout_ms)
        if who.rate_per_s is not None:  # (measuring capacity costs a little: only for limited callers)
            self.limiter.check(who, model.name, model.capacity_scale(), now)
        self._shed_by_predicted_wait(model, who.tier, timeout_ms / 1000.0, now)
        return timeout_ms / 1000.0

    def enqueue(
        self, model: ServedModel, request_id: str, who: Identity, timeout_s: float, value: Any, bucket: int, raw: str
    ) -> PendingRequest:
        """Queue the (prepared) input; the queue bound is checked atomically here."""
        try:
            return model.submit(request_id, value, timeout_s, who.tier, who.tenant, bucket, raw if value is not raw else None)
        except QueueFull:
            raise ServiceOverloaded(
                f"model {model.name} has {model.config.max_queue} requests waiting",
                retry_after_ms=model.retry_after_ms(who.tier),
                reason="queue_full",
            ) from None

    def _shed_by_predicted_wait(self, model: ServedModel, tier: str, timeout_s: float, now: float) -> None:
        wait_s = model.predicted_wait_s(tier, now)
        retry_ms = max(1, min(60_000, math.ceil(wait_s * 1000))) if not math.isinf(wait_s) else 1000
        if wait_s + model.compute_ewma_s > timeout_s:
            raise ServiceOverloaded(
                f"predicted wait {wait_s * 1000:.0f} ms plus {model.compute_ewma_s * 1000:.0f} ms of compute "
                f"exceeds this request's {timeout_s * 1000:.0f} ms deadline",
                retry_after_ms=retry_ms,
                reason="deadline_infeasible",
            )
        limit_s = self.tier_wait_limit_s.get(tier)
        if limit_s is not None and wait_s > limit_s:
            raise ServiceOverloaded(
                f"predicted wait {wait_s * 1000:.0f} ms is over the {tier} tier's {limit_s * 1000:.0f} ms",
                retry_after_ms=retry_ms,
                reason="tier_predicted_wait",
            )
