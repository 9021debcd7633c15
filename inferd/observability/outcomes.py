"""Each answered request counted and maybe logged: what every handler does last, whatever the model kind."""

from __future__ import annotations

import time

from ..errors import InferdError
from ..messages import PendingRequest
from .access_log import AccessLog
from .metrics import RequestMetrics
from .tracing import RequestTrace

_ADMITTED_ANSWERS = frozenset((200, 500, 504))  # what an admitted request ends with, as far as its objective goes


class Outcomes:
    """Counts answers by model, tier, status and error code, times their stages, and passes them to the
    sampled access log. `metrics` is None when metrics are off."""

    def __init__(self, metrics: RequestMetrics | None, access_log: AccessLog) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def record(
        self, request_id: str, model: str, tier: str, status: int, error: str, started: float,
        pending: PendingRequest | None = None, tenant: str = "-", trace: RequestTrace | None = None, version: str = "",
        slo_at: float | None = None,
    ) -> float:
        """One answer; returns the time it was recorded. `slo_at`: when its latency objective ended, for a
        call of several requests (one request's is its own)."""
        now = time.monotonic()
        metrics = self.metrics
        if metrics is not None:
            metrics.requests[(model, version, tier, status, error)] += 1
            metrics.duration[model].observe(now - started)
            if pending is not None:
                slo_at = pending.slo_at
            if slo_at is not None and status in _ADMITTED_ANSWERS:  # (not counted: refused, or the client left)
                metrics.objectives[(model, version, tier, "met" if status == 200 and now <= slo_at else "missed")] += 1
            if pending is not None:
                metrics.admission[model].observe(pending.enqueued_at - started)
                if pending.batch is not None and status == 200:
                    metrics.response[model].observe(now - pending.batch.finished_at)
        if trace is not None or self.access_log.wants(status):  # (a traced request is always logged, with its trace id)
            self.access_log.record(request_id, model, tier, status, error, now - started, pending, tenant,
                                   trace.trace_id if trace is not None else None)
        return now

    def record_error(
        self, request_id: str, model: str, tier: str, error: InferdError, started: float,
        pending: PendingRequest | None = None, tenant: str = "-", trace: RequestTrace | None = None, version: str = "",
        slo_at: float | None = None,
    ) -> float:
        """An error answer; refusals (429, 503) are also counted by reason, a queued request evicted to make
        room (reason `shed_for_...`) as shed. Returns the time it was recorded."""
        if error.status in (429, 503) and self.metrics is not None:
            reason = error.reason
            if reason.startswith("shed_"):
                self.metrics.shed[(model, tier, reason[5:])] += 1
            else:
                self.metrics.refused[(model, tier, reason)] += 1
        return self.record(request_id, model, tier, error.status, error.code, started, pending, tenant, trace, version, slo_at)
