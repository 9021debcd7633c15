"""Admission: whether a parsed request may enter a model's queue, and on what deadline.

Refusals happen here, before any work: draining, not ready, input too long, queue full. A 503 always
carries `retry_after_ms`, estimated from the queue and the model's measured throughput.
"""

from __future__ import annotations

import math
import time

from .batcher import QueueFull
from .errors import (
    Draining,
    InvalidInput,
    ModelUnavailable,
    NotReady,
    ServiceOverloaded,
)
from .lifecycle import Lifecycle
from .messages import PendingRequest
from .protocol import InferenceCall
from .served_model import ServedModel


class Admission:
    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def check_open(self) -> None:
        if self.lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)

    def admit(self, model: ServedModel, call: InferenceCall, request_id: str) -> PendingRequest:
        self.check_open()
        config = model.config
        if len(call.input) > config.max_input_chars:
            raise InvalidInput(f"`input` is {len(call.input)} characters; model {model.name} accepts at most {config.max_input_chars}")
        unavailable_s = model.unavailable_for_s(time.monotonic())
        if unavailable_s is not None:
            raise ModelUnavailable(
                f"model {model.name} is failing; its circuit breaker is open", retry_after_ms=math.ceil(unavailable_s * 1000)
            )
        if not model.ready:
            if model.warmed:
                raise NotReady(f"model {model.name} has no healthy worker", retry_after_ms=1000)
            raise NotReady(f"model {model.name} is warming up", retry_after_ms=1000)
        timeout_ms = config.timeout_ms if call.timeout_ms is None else min(call.timeout_ms, config.max_timeout_ms)
        try:
            return model.submit(request_id, call.input, timeout_ms / 1000.0)
        except QueueFull:
            raise ServiceOverloaded(
                f"model {model.name} has {config.max_queue} requests waiting",
                retry_after_ms=model.retry_after_ms(),
            ) from None
