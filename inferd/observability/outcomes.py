"""Each answered request counted and maybe logged: what every handler does last, whatever the model kind."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import InferdError
from ..messages import Client, PendingRequest
from .access_log import AccessLog
from .metrics import RequestMetrics
from .tracing import RequestTrace

_ADMITTED_ANSWERS = frozenset((200, 500, 504))  # what an admitted request ends with, as far as its objective goes


@dataclass(slots=True)
class Call:
    """One call (an HTTP or gRPC request of one input or several) as far as it got: made where it comes
    in, filled in as it is identified, routed and admitted, and what its answer or refusal is recorded
    with (`Outcomes.record`), whichever way it ends."""

    started: float  # (time.monotonic(): every stage is measured from it)
    request_id: str
    trace: RequestTrace | None = None  # when sampled
    tier: str = "-"
    tenant: str = "-"
    model: str = "-"
    version: str = ""
    requests: list[PendingRequest] = field(default_factory=list)  # its inputs' requests, once admitted
    client: Client | None = None  # the connection it came on (the batcher watches it for a closed loop's echo)


class Outcomes:
    """Counts answers by model, tier, status and error code, times their stages, and passes them to the
    sampled access log. `metrics` is None when metrics are off."""

    def __init__(self, metrics: RequestMetrics | None, access_log: AccessLog) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def record(self, call: Call, status: int = 200, error: str = "") -> float:
        """A call's answer; returns the time it was recorded. A call of one request is timed by its
        stages too; a call's latency objective is its requests' (they share one)."""
        now = time.monotonic()
        requests = call.requests
        pending = requests[0] if len(requests) == 1 else None
        metrics = self.metrics
        if metrics is not None:
            model, version, tier = call.model, call.version, call.tier
            metrics.requests[(model, version, tier, status, error)] += 1
            metrics.duration[model].observe(now - call.started)
            slo_at = requests[0].slo_at if requests else None
            if slo_at is not None and status in _ADMITTED_ANSWERS:  # (not counted: refused, or the client left)
                metrics.objectives[(model, version, tier, "met" if status == 200 and now <= slo_at else "missed")] += 1
            if pending is not None:
                metrics.admission[model].observe(pending.enqueued_at - call.started)
                if pending.batch is not None and status == 200:
                    metrics.response[model].observe(now - pending.batch.finished_at)
        trace = call.trace
        if trace is not None or self.access_log.wants(status):  # (a traced request is always logged, with its trace id)
            self.access_log.record(call, status, error, now - call.started, pending,
                                   trace.trace_id if trace is not None else None)
        return now

    def record_error(self, call: Call, error: InferdError) -> float:
        """An error answer; refusals (429, 503) are also counted by reason, a queued request evicted to make
        room (reason `shed_for_...`) as shed. Returns the time it was recorded."""
        if error.status in (429, 503) and self.metrics is not None:
            reason = error.reason
            if reason.startswith("shed_"):
                self.metrics.shed[(call.model, call.tier, reason[5:])] += 1
            else:
                self.metrics.refused[(call.model, call.tier, reason)] += 1
        return self.record(call, error.status, error.code)
