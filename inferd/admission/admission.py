"""Admission: whether a request may go to a model, and on what deadline.

Every refusal happens before any work, cheapest check first: draining, input too long, breaker open,
not ready, the tenant's rate limit (429) here; then the model's own question, asked as it takes the
input: would this request finish in time? A request whose predicted wait plus its own batch (costed
by the model's cost model) ends past its deadline or its latency objective is refused at once (503)
rather than queued to miss it; past its tier's `max_predicted_wait_ms` a lower tier is refused while a
higher one still gets in. A 503 always carries `retry_after_ms`. Batch and generation models go through
the same entry points: `identify`, then `admit` (the inputs are handed to the batch model, which
prepares and queues them) or `admit_generation` (which returns the deadline and engine priority the
stream runs under).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import ModelConfig, TierConfig
from ..errors import Draining, InvalidInput
from ..lifecycle import Lifecycle
from ..messages import Client, PendingRequest
from ..models.batch_model import BatchModel
from .auth import Authenticator
from .rate_limits import Identity, RateLimiter

if TYPE_CHECKING:
    from ..models.generation import GenerationModel
    from ..models.generation_promises import Promise


@dataclass(frozen=True, slots=True)
class GenerationTicket:
    """What an admitted generation runs under."""

    timeout_s: float
    priority: int  # the engine's: lower runs first
    promise: Promise  # its place among what the engine has been given, and its objectives


class Admission:
    """The gate in front of every model."""

    def __init__(self, lifecycle: Lifecycle, auth: Authenticator, limiter: RateLimiter, tiers: tuple[TierConfig, ...]) -> None:
        self.lifecycle = lifecycle
        self.auth = auth
        self.limiter = limiter
        self.engine_priority = {t.name: -t.priority for t in tiers}  # vLLM schedules lower values first
        self.tiers = {t.name: t for t in tiers}

    def identify(self, headers: Mapping[str, str]) -> Identity:
        """The caller's tenant and tier (401 for a wrong key, or none where anonymous callers are refused)."""
        return self.auth.identify(headers)

    def admit(
        self, model: BatchModel, request_id: str, values: Sequence[Any], who: Identity, timeout_ms: int | None,
        use_cache: bool = True, client: Client | None = None,
    ) -> list[PendingRequest]:
        """Admit the inputs of one call to a batch model, all or none (one for /v1/inference, several for
        /v1/embeddings, each batched as a request of its own; rate limits count each). An input cached or
        already in flight is answered without entering the queue, so only the others are shed for the
        queue's sake. The caller awaits each request's `.future`."""
        config = model.config
        for value in values:
            if len(value) > config.max_input_chars and type(value) is not bytes:  # (an image's limits are its model's)
                raise InvalidInput(f"input is {len(value)} characters; model {model.name} accepts at most {config.max_input_chars}")
        self._check_open()
        now = time.monotonic()
        unavailable = model.unavailable(now)
        if unavailable is not None:
            raise unavailable
        if who.rate_per_s is not None:  # (measuring capacity costs a little: only for limited callers)
            self.limiter.check(who, model.name, model.capacity_scale(), now, len(values))
        return model.take(request_id, values, timeout_s(config, timeout_ms), who.tier, who.tenant, use_cache, client)

    def admit_generation(self, model: GenerationModel, who: Identity, timeout_ms: int | None, chars: int,
                         max_tokens: int | None = None, arrived_at: float | None = None) -> GenerationTicket:
        """Admit one generation before its prompt (`chars` long) is tokenised: the same length check,
        open check, rate limit and deadline rule as batch models, then the engine's waiting bounds and,
        where the model or the tier sets them, its predicted time to first token and per output token
        against the tighter of the two objectives. The ticket holds the request's place among the
        engine's requests: `GenerationModel.withdraw` gives it back if the request goes no further."""
        model.check_length(chars)
        self._check_open()
        if who.rate_per_s is not None:
            self.limiter.check(who, model.name, model.capacity_scale(), time.monotonic())
        priority = self.engine_priority.get(who.tier, 0)
        objectives = model.objectives(self.tiers.get(who.tier))
        promise = model.check_capacity(priority, chars, max_tokens, objectives,
                                       time.monotonic() if arrived_at is None else arrived_at)
        return GenerationTicket(timeout_s(model.config, timeout_ms), priority, promise)

    def _check_open(self) -> None:
        if self.lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)


def timeout_s(config: ModelConfig, timeout_ms: int | None) -> float:
    """How long a request may take (seconds from its arrival): the model's default, or the client's `timeout_ms`
    capped at the model's maximum."""
    return (config.timeout_ms if timeout_ms is None else min(timeout_ms, config.max_timeout_ms)) / 1000.0
