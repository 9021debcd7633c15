"""What a batch model tells others about itself: a snapshot for the metrics exporter, and a
description (settings and live statistics) for GET /v1/models and /v1/stats."""

from __future__ import annotations

from typing import Any, Protocol

from ..config import ModelConfig
from ..execution.breaker import CircuitBreaker
from ..execution.pool import WorkerPool
from ..observability.batch_stats import BatchStats
from ..observability.metrics import RequestMetrics
from ..observability.snapshots import BatchModelSnapshot, CacheSnapshot
from ..scheduling.batch_costs import BatchCosts
from ..scheduling.batcher import Batcher
from ..scheduling.preprocess import Preprocessor
from .forecast import Forecast
from .result_cache import ResultCache
from .shared_work import SharedWork
from .timeliness import Timeliness


class ReportedModel(Protocol):
    """What a report reads of the batch model it describes (`batch_model.BatchModel`)."""

    name: str
    version: str
    takes_traffic: bool
    config: ModelConfig
    metrics: RequestMetrics
    stats: BatchStats
    batcher: Batcher
    shared: SharedWork
    pool: WorkerPool
    forecast: Forecast
    costs: BatchCosts
    timeliness: Timeliness
    breaker: CircuitBreaker
    preprocessor: Preprocessor | None
    prepare_one: Any
    output_kind: str | None
    input_kind: str

    @property
    def ready(self) -> bool: ...

    def predicted_wait_s(self, tier: str | None = None, now: float | None = None, tenant: str | None = None) -> float: ...


def snapshot(model: ReportedModel, now: float) -> BatchModelSnapshot:
    model.costs.refresh_margins(now)  # (they fade with time: the gauge shows them as they stand now)
    return BatchModelSnapshot(
        name=model.name, version=model.version, takes_traffic=model.takes_traffic, ready=model.ready,
        waiting_by_tier=model.batcher.depth_by_tier(),
        oldest_age_by_tier=model.batcher.oldest_age_by_tier(now), workers=model.pool.snapshot(now),
        healthy_workers=model.pool.healthy, capacity_rps=model.forecast.capacity_rps(model.pool.healthy),
        predicted_wait_s=model.predicted_wait_s(now=now), queue_wait=model.stats.queue_wait, linger=model.stats.linger,
        compute=model.stats.compute, input_tokens=model.stats.input_tokens if model.stats.input_tokens.count else None,
        batch_sizes=dict(model.stats.batch_sizes), flushes=dict(model.batcher.flushes),
        collapsed=model.shared.collapsed, cache=_cache_snapshot(model.shared.cache),
        batch_costs=tuple(model.costs.measured_shapes()), wait_error=dict(model.timeliness.wait_error),
        admission_margin=model.costs.slack, worker_deaths=model.pool.deaths,
        echo_holds=(model.batcher.echo.returned, model.batcher.echo.cut, model.batcher.echo.held_s),
    )


def _cache_snapshot(cache: ResultCache | None) -> CacheSnapshot | None:
    if cache is None:
        return None
    return CacheSnapshot(hits=cache.hits, misses=cache.misses, evictions=cache.evictions, expirations=cache.expirations,
                         bytes=cache.bytes, entries=len(cache))


def _echo(model: ReportedModel) -> dict[str, Any]:
    """How the closed-loop echo held free workers (`scheduling.arrivals.Echo`): how often, for how long in
    all, how long after its first arrival an echo is worth waiting for (`spread_ms`, the highest of
    late: back whole, or but for a few clients that think long), how often the clients came back whole
    (their batch left at once, trigger "echo") or the batch left before (`cut`), and how many
    connections were found slow (not waited for again until they come back while a worker is held)."""
    echo = model.batcher.echo
    return {"expected": echo.expected, "score": round(echo.score, 3), "echo_ms": round(echo.echo_s * 1000, 3),
            "spread_ms": round(echo.spread_s * 1000, 3), "holds": echo.holds, "came_back_whole": echo.returned,
            "cut": echo.cut, "held_ms_total": round(echo.held_s * 1000, 1), "slow_connections": echo.slow}


def describe(model: ReportedModel) -> dict[str, Any]:
    c, pool, preprocessor = model.config, model.pool, model.preprocessor
    settings = ("backend", "max_batch_size", "max_wait_ms", "slo_ms", "max_batch_tokens", "max_queue", "timeout_ms",
                "max_timeout_ms", "collapse")
    cache = _cache_snapshot(model.shared.cache)
    offers = next((w.capabilities for w in pool.workers if w.ready), None)
    return {
        "name": c.name, "version": c.version, **{key: getattr(c, key) for key in settings}, "workers": len(pool.workers),
        # What keeps two requests out of one batch: another model or version (each has its own queue and
        # workers), another length bucket, and whatever the backend declares changes its computation.
        "batch_key": {"model": c.name, "version": c.version, "bucket": "per input, from the backend's prepare"
                      if model.preprocessor is not None or model.prepare_one is not None else "one",
                      **(offers.compatibility if offers is not None else {})},
        "devices": list(c.worker_devices), "ready": model.ready, "ready_workers": pool.healthy,
        "breaker": model.breaker.state.value, "workers_replaced": pool.replacements,
        "worker_deaths": pool.deaths, "worker_repeated_deaths": pool.repeated_deaths,
        "worker_build_failures": pool.build_failures, "batch_timeout_ms": round(pool.hang_limit.limit_s * 1000, 1),
        "output_kind": model.output_kind,
        "inputs": model.input_kind, "warmup": {w.name: w.warmup_report for w in pool.workers if w.ready},
        "cache": None if cache is None else {
            "max_bytes": c.cache_bytes, "ttl_s": c.cache_ttl_s, "scope": c.cache_scope, "bytes": cache.bytes,
            "entries": cache.entries, "hits": cache.hits, "misses": cache.misses, "evictions": cache.evictions,
            "expirations": cache.expirations,
        },
        "stats": {
            "batches": model.stats.batches, "requests_computed": model.stats.requests_computed,
            "requests_collapsed": model.shared.collapsed, "inputs_in_flight": len(model.shared),
            "mean_batch_size": model.stats.mean_batch_size,
            "batch_ms_ewma": round(model.forecast.batch_s * 1000, 3),
            "capacity_rps": round(model.forecast.capacity_rps(pool.healthy), 1), "queue_depth": model.batcher.depth,
            "predicted_wait_ms": round(min(model.predicted_wait_s(), 1e9) * 1000, 3),
            "flushes": dict(model.batcher.flushes), "echo_holds": model.batcher.echo.holds, "echo": _echo(model),
            "shed_for_room": model.batcher.shed,
            "size_probes": model.batcher.size_probes,
            "busy_gap_ms_p50": model.forecast.gap_p50_ms(),
            "batch_sizes": {str(size): n for size, n in sorted(model.stats.batch_sizes.items())},
            "preprocess_calls": preprocessor.calls if preprocessor else 0,
            "preprocess_mean_batch": round(preprocessor.items / preprocessor.calls, 2)
            if preprocessor and preprocessor.calls else None,
            "objectives": _objectives(model), "wait_error": _wait_errors(model),
        },
        "cost_model": model.costs.describe(),
    }


def _objectives(model: ReportedModel) -> dict[str, dict[str, Any]]:
    """Per tier: admitted requests with a latency objective that met it and missed it, and the share met."""
    counts: dict[str, dict[str, Any]] = {}
    for (name, version, tier, result), n in list(model.metrics.objectives.items()):
        if name == model.name and version == model.version:
            counts.setdefault(tier, {"met": 0, "missed": 0})[result] += n
    for tier_counts in counts.values():
        total = tier_counts["met"] + tier_counts["missed"]
        tier_counts["met_share"] = round(tier_counts["met"] / total, 5) if total else None
    return counts


def _wait_errors(model: ReportedModel) -> dict[str, dict[str, Any]]:
    """Per tier: how far actual waits have been from the waits predicted at admission (ms)."""
    return {tier: {"requests": h.count, "mean_ms": round(h.mean * 1000, 3) if h.mean is not None else None}
            for tier, h in model.timeliness.wait_error.items()}
