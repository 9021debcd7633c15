"""Structured access logs: one JSON line per request, sampled so logging never becomes the bottleneck.

A request that is not sampled costs one random draw. Answers that point at a server-side problem (500
and 504) are always logged, whatever the sampling.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import random
import sys
import time
from typing import Any

import orjson

from ..messages import PendingRequest, RequestState

_SHARED = (RequestState.ATTACHED, RequestState.CACHED)
log = logging.getLogger("inferd.access")


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Never blocks the event loop: when the writer thread falls behind, lines are dropped and counted."""

    def __init__(self, lines: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(lines)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


def dropped_lines() -> int:
    """Access log lines dropped because the writer thread fell behind (exported to /metrics)."""
    return sum(h.dropped for h in log.handlers if isinstance(h, _DroppingQueueHandler))


def configure_access_logger(max_pending_lines: int = 10_000) -> logging.handlers.QueueListener:
    """Bare JSON lines on stdout, written by a background thread so a slow stdout never stalls serving."""
    writer = logging.StreamHandler(sys.stdout)
    writer.setFormatter(logging.Formatter("%(message)s"))
    lines: queue.Queue[logging.LogRecord] = queue.Queue(max_pending_lines)
    log.addHandler(_DroppingQueueHandler(lines))
    log.propagate = False
    log.setLevel(logging.DEBUG)
    listener = logging.handlers.QueueListener(lines, writer)
    listener.start()
    return listener


def _timestamp() -> str:
    """Now, in UTC, to the millisecond (ISO 8601), as log pipelines parse it."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


class AccessLog:
    """Writes (some of) the answers as JSON lines: every 500 and 504, others at the sample rate."""

    def __init__(self, level: str, sample_rate: float) -> None:
        self.off = level.lower() == "off"
        self.level = logging.INFO if self.off else logging.getLevelName(level.upper())
        self.sample_rate = 0.0 if self.off else sample_rate
        self._draw = random.random

    def wants(self, status: int) -> bool:
        """Whether this answer is logged: 500 and 504 always, others by sampling (one random draw)."""
        return status == 500 or status == 504 or (self.sample_rate > 0.0 and self._draw() < self.sample_rate)

    def record(
        self,
        request_id: str,
        model: str,
        tier: str,
        status: int,
        error: str,
        latency_s: float,
        pending: PendingRequest | None,
        tenant: str = "-",
        trace_id: str | None = None,
    ) -> None:
        """Write one line (callers ask `wants` first)."""
        must = status in (500, 504)
        line: dict[str, Any] = {
            "ts": _timestamp(),
            "request_id": request_id,
            "model": model,
            "tier": tier,
            "tenant": pending.tenant if pending is not None else tenant,
            "status": status,
            "latency_ms": round(latency_s * 1000, 3),
        }
        if error:
            line["error"] = error
        if trace_id is not None:
            line["trace_id"] = trace_id
        if pending is not None and pending.state in _SHARED:
            line["shared"] = pending.state.value  # attached (collapsed) or cached
        batch = pending.batch if pending is not None else None
        if batch is not None:
            line.update(
                batch_id=batch.batch_id,
                batch_size=batch.size,
                worker=batch.worker,
                queue_ms=round(batch.queue_s(pending) * 1000, 3),  # type: ignore[arg-type]
                compute_ms=round(batch.compute_s * 1000, 3),
                bucket=pending.bucket,  # type: ignore[union-attr]
            )
        log.log(logging.WARNING if must else self.level, orjson.dumps(line).decode())
