"""Prometheus metrics: recorded on the hot path for a fraction of a microsecond, exported by prometheus-client.

Everything here is written on the event loop thread only, so recording is a dict increment or a bisect
into fixed buckets, with no lock (prometheus-client's own Histogram takes a lock per observation, which
cost several percent at 9,000 req/s). At scrape time `InferdCollector` turns these counts, and the
models' live state, into metric families that prometheus-client renders in the text format. A scrape
reads plain attributes and never waits on a worker.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .access_log import dropped_lines

if TYPE_CHECKING:
    from .generation import GenerationModel
    from .lifecycle import Lifecycle
    from .served_model import ServedModel

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100, 128, 192, 256, 512, 1024)


class Histogram:
    """Fixed-bucket counts, updated on the event loop only."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # `le` buckets: the first bound >= value
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=False):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class RequestMetrics:
    """Per-request outcomes and stage times, recorded by the HTTP layer and the models."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, int, str], int] = defaultdict(int)  # model, tier, status, error
        self.shed: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # model, tier, reason
        self.duration: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.admission: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.response: defaultdict[str, Histogram] = defaultdict(Histogram)


class InferdCollector(Collector):
    def __init__(
        self,
        models: dict[str, ServedModel],
        requests: RequestMetrics,
        lifecycle: Lifecycle,
        generators: dict[str, GenerationModel] | None = None,
    ) -> None:
        self.models = models
        self.requests = requests
        self.lifecycle = lifecycle
        self.generators = generators or {}

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        r = self.requests
        total = CounterMetricFamily("inferd_requests", "Requests answered, by HTTP status and error code.",
                                    labels=["model", "tier", "code", "error"])
        for (model, tier, status, error), n in list(r.requests.items()):
            total.add_metric([model, tier, str(status), error], n)
        yield total
        shed = CounterMetricFamily("inferd_shed", "Requests refused or dropped before computing, by reason.",
                                   labels=["model", "tier", "reason"])
        for (model, tier, reason), n in list(r.shed.items()):
            shed.add_metric([model, tier, reason], n)
        yield shed
        yield _histograms("inferd_request_duration_seconds", "End-to-end time inside the server.", r.duration)
        yield _histograms("inferd_admission_seconds", "From the request's arrival to its entry in the queue.", r.admission)
        yield _histograms("inferd_response_seconds", "From the end of the backend call to the response.", r.response)
        models = self.models
        yield _histograms("inferd_queue_wait_seconds", "From entering the queue to the start of its batch.",
                          {n: m.queue_wait for n, m in models.items()})
        yield _histograms("inferd_batch_linger_seconds", "How long a free worker waited for its batch to fill.",
                          {n: m.linger for n, m in models.items()})
        yield _histograms("inferd_compute_seconds", "Backend call duration, one observation per call.",
                          {n: m.compute for n, m in models.items()})
        sizes = HistogramMetricFamily("inferd_batch_size", "Requests per batch.", labels=["model"])
        for name, m in models.items():
            h = Histogram(BATCH_SIZE_BUCKETS)
            for size, n in list(m.batch_sizes.items()):
                h.counts[bisect_left(h.bounds, size)] += n
                h.sum += size * n
            sizes.add_metric([name], h.cumulative(), h.sum)
        yield sizes
        batches = CounterMetricFamily("inferd_batches", "Batches flushed, by trigger.", labels=["model", "trigger"])
        for name, m in models.items():
            for trigger, n in list(m.batcher.flushes.items()):
                batches.add_metric([name, trigger], n)
        yield batches

        gauges = {
            "inferd_queue_depth": ("Requests waiting for a batch.", ["model", "tier"]),
            "inferd_queue_oldest_age_seconds": ("Age of the oldest waiting request.", ["model", "tier"]),
            "inferd_batches_in_flight": ("Batches inside backend calls now.", ["model"]),
            "inferd_workers_healthy": ("Workers built, warm and running.", ["model"]),
            "inferd_workers": ("Configured workers.", ["model"]),
            "inferd_capacity_requests_per_second": ("Requests/s the healthy workers sustain, measured.", ["model"]),
            "inferd_predicted_wait_seconds": ("Predicted wait of a request queued now: the scaling signal.", ["model"]),
        }
        families = {name: GaugeMetricFamily(name, doc, labels=labels) for name, (doc, labels) in gauges.items()}
        busy = GaugeMetricFamily("inferd_worker_busy_ratio", "Share of the last window a worker spent in backend calls.",
                                 labels=["model", "worker"])
        waiting = running = 0
        worst_wait = 0.0
        for name, m in models.items():
            depths, ages = m.depth_by_tier(now)
            for tier, depth in depths.items():
                families["inferd_queue_depth"].add_metric([name, tier], depth)
                families["inferd_queue_oldest_age_seconds"].add_metric([name, tier], ages.get(tier, 0.0))
            in_flight = sum(1 for w in m.workers if w.current is not None)
            running += sum(len(w.current.requests) for w in m.workers if w.current is not None)
            waiting += m.batcher.depth
            predicted = m.predicted_wait_s()
            worst_wait = max(worst_wait, predicted)
            families["inferd_batches_in_flight"].add_metric([name], in_flight)
            families["inferd_workers_healthy"].add_metric([name], m.ready_workers)
            families["inferd_workers"].add_metric([name], len(m.workers))
            families["inferd_capacity_requests_per_second"].add_metric([name], m.capacity_rps())
            families["inferd_predicted_wait_seconds"].add_metric([name], min(predicted, 1e9))
            for worker in m.workers:
                busy.add_metric([name, worker.name], m.busy_ratio(worker, now))
        yield from families.values()
        yield busy
        if self.generators:
            yield from self._generation_families()
            waiting += sum(len(g.waiting) for g in self.generators.values())
            running += sum(g.running for g in self.generators.values())
        yield GaugeMetricFamily("inferd_requests_waiting", "Admitted requests not yet in a batch (all models).", value=waiting)
        yield GaugeMetricFamily("inferd_requests_running", "Requests inside executing batches (all models).", value=running)
        yield GaugeMetricFamily("inferd_predicted_wait_max_seconds", "Worst predicted wait across models.",
                                value=min(worst_wait, 1e9))
        yield CounterMetricFamily("inferd_access_log_dropped_lines", "Access log lines dropped: the writer fell behind.",
                                  value=dropped_lines())
        yield GaugeMetricFamily("inferd_ready", "1 when every model is ready and the server is not draining.",
                                value=float(self.lifecycle.serving and all(m.ready for m in models.values())
                                            and all(g.ready for g in self.generators.values())))

    def _generation_families(self) -> Iterator[Metric]:
        gens = self.generators
        yield _histograms("inferd_generation_time_to_first_token_seconds", "From arrival to the first generated token.",
                          {n: g.metrics.ttft for n, g in gens.items()})
        yield _histograms("inferd_generation_time_per_output_token_seconds", "Time between generated tokens.",
                          {n: g.metrics.time_per_output_token for n, g in gens.items()})
        tokens = CounterMetricFamily("inferd_generation_tokens", "Tokens processed (rate: tokens per second).",
                                     labels=["model", "kind"])
        aborts = CounterMetricFamily("inferd_generation_aborts", "Requests aborted in the engine, by reason.",
                                     labels=["model", "reason"])
        requests = GaugeMetricFamily("inferd_generation_requests", "Requests by state: waiting means no token yet.",
                                     labels=["model", "state"])
        engine = GaugeMetricFamily("inferd_generation_engine_requests", "The engine scheduler's own counts.",
                                   labels=["model", "state"])
        kv = GaugeMetricFamily("inferd_generation_kv_cache_usage_ratio", "Share of the KV cache in use.", labels=["model"])
        for name, g in gens.items():
            tokens.add_metric([name, "output"], g.metrics.output_tokens)
            tokens.add_metric([name, "prompt"], g.metrics.prompt_tokens)
            for reason, n in list(g.metrics.aborts.items()):
                aborts.add_metric([name, reason], n)
            requests.add_metric([name, "waiting"], len(g.waiting))
            requests.add_metric([name, "running"], g.running)
            stats = g.engine.stats
            engine.add_metric([name, "waiting"], stats.waiting)
            engine.add_metric([name, "running"], stats.running)
            kv.add_metric([name], stats.kv_cache_usage)
        yield from (tokens, aborts, requests, engine, kv)


def _histograms(name: str, doc: str, per_model: dict[str, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["model"])
    for model, h in list(per_model.items()):
        family.add_metric([model], h.cumulative(), h.sum)
    return family


def build_registry(collector: InferdCollector) -> CollectorRegistry:
    """A registry of this server's own (no process-global state), with the standard process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry
