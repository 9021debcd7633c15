"""Prometheus metrics: per-request outcomes recorded on the hot path, and the exporter that turns them,
and the snapshots the models provide, into metric families at scrape time.

Recording is a dict increment or a histogram observation on the event loop, with no lock. The exporter
(`InferdCollector`) is handed a function returning the models' snapshots (`snapshots.py`); it knows
nothing of batchers, workers or engines, and a scrape never waits on a worker.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from .access_log import dropped_lines
from .histogram import Histogram
from .snapshots import BatchModelSnapshot, GenerationSnapshot

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100, 128, 192, 256, 512, 1024)

Snapshots = Callable[[], tuple[list[BatchModelSnapshot], list[GenerationSnapshot]]]


class RequestMetrics:
    """Per-request outcomes and stage times, recorded by the HTTP layer and by admission."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, str, int, str], int] = defaultdict(int)  # model, version, tier, status, error
        self.refused: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # model, tier, reason: 429s and 503s
        self.shed: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # model, tier, for whom: queued ones evicted
        self.expired: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # model, tier, where: deadlines passed
        # admitted requests with a latency objective, by whether they met it: model, version, tier, met|missed
        self.objectives: defaultdict[tuple[str, str, str, str], int] = defaultdict(int)
        self.duration: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.admission: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.response: defaultdict[str, Histogram] = defaultdict(Histogram)
        # unloaded versions as they ended: what they served from the cache or by collapsing stays counted
        self.retired: dict[tuple[str, str], BatchModelSnapshot] = {}


class InferdCollector(Collector):
    """Turns request metrics and model snapshots into Prometheus metric families, per scrape."""

    def __init__(self, requests: RequestMetrics, snapshots: Snapshots, ready: Callable[[], bool]) -> None:
        self.requests = requests
        self.snapshots = snapshots
        self.ready = ready

    def collect(self) -> Iterator[Metric]:
        r = self.requests
        total = CounterMetricFamily("inferd_requests", "Requests answered, by HTTP status and error code.",
                                    labels=["model", "version", "tier", "code", "error"])
        for (model, version, tier, status, error), n in list(r.requests.items()):
            total.add_metric([model, version, tier, str(status), error], n)
        yield total
        for name, help_text, label, counts in (
                ("inferd_refused", "Requests refused at once (429, 503), by reason.", "reason", r.refused),
                ("inferd_shed", "Queued requests evicted to make room for a higher tier's or a lighter tenant's.",
                 "reason", r.shed),
                ("inferd_expired", "Requests whose deadline passed before their answer (504), by where they were.",
                 "where", r.expired)):
            family = CounterMetricFamily(name, help_text, labels=["model", "tier", label])
            for (model, tier, reason), n in list(counts.items()):
                family.add_metric([model, tier, reason], n)
            yield family
        objectives = CounterMetricFamily(
            "inferd_objective_requests", "Admitted requests with a latency objective (slo_ms), by whether they met it.",
            labels=["model", "version", "tier", "result"])
        for (model, version, tier, result), n in list(r.objectives.items()):
            objectives.add_metric([model, version, tier, result], n)
        yield objectives
        yield _histograms("inferd_request_duration_seconds", "End-to-end time inside the server.", r.duration)
        yield _histograms("inferd_admission_seconds", "From the request's arrival to its entry in the queue.", r.admission)
        yield _histograms("inferd_response_seconds", "From the end of the backend call to the response.", r.response)
        batch, generation = self.snapshots()
        live = {(m.name, m.version) for m in batch}
        yield from _batch_families(batch, [m for key, m in list(r.retired.items()) if key not in live])
        waiting = sum(m.waiting for m in batch) + sum(g.waiting for g in generation)
        running = sum(w.running_requests for m in batch for w in m.workers) + sum(g.running for g in generation)
        if generation:
            yield from _generation_families(generation)
        yield GaugeMetricFamily("inferd_requests_waiting", "Admitted requests not yet in a batch (all models).", value=waiting)
        yield GaugeMetricFamily("inferd_requests_running", "Requests inside executing batches (all models).", value=running)
        yield GaugeMetricFamily("inferd_predicted_wait_max_seconds", "Worst predicted wait across models.",
                                value=min(max((m.predicted_wait_s for m in batch if m.takes_traffic), default=0.0), 1e9))
        yield CounterMetricFamily("inferd_access_log_dropped_lines", "Access log lines dropped: the writer fell behind.",
                                  value=dropped_lines())
        yield GaugeMetricFamily("inferd_ready", "1 when every model is ready and the server is not draining.",
                                value=float(self.ready()))
        build = GaugeMetricFamily("inferd_build_info", "Always 1: the version serving, and its Python.", labels=["version", "python"])
        build.add_metric([__version__, platform.python_version()], 1.0)
        yield build


def _batch_families(models: list[BatchModelSnapshot], retired: list[BatchModelSnapshot]) -> Iterator[Metric]:
    """Each live version's families; `retired`: unloaded versions, whose counters stay (a counter that
    vanished with its version would undercount every rate summed over versions)."""
    yield _histograms("inferd_queue_wait_seconds", "From entering the queue to the start of its batch.",
                      {(m.name, m.version): m.queue_wait for m in models}, "version")
    yield _histograms("inferd_batch_linger_seconds", "How long a free worker waited for its batch to fill.",
                      {(m.name, m.version): m.linger for m in models}, "version")
    yield _histograms("inferd_compute_seconds", "Backend call duration, one observation per call.",
                      {(m.name, m.version): m.compute for m in models}, "version")
    yield _histograms("inferd_input_tokens", "Tokens of each computed input, where its backend counts them (_sum: all of them).",
                      {(m.name, m.version): m.input_tokens for m in models if m.input_tokens is not None}, "version")
    yield _histograms("inferd_wait_prediction_error_seconds",
                      "Actual minus predicted wait of admitted requests (negative: shorter than predicted).",
                      {(m.name, m.version, tier): h for m in models for tier, h in m.wait_error.items()}, "version", "tier")
    costs = GaugeMetricFamily("inferd_batch_cost_seconds", "The cost model's estimate of a backend call, per measured shape.",
                              labels=["model", "version", "bucket", "size"])
    for m in models:
        for bucket, size, seconds in m.batch_costs:
            costs.add_metric([m.name, m.version, str(bucket), str(size)], seconds)
    yield costs
    sizes = HistogramMetricFamily("inferd_batch_size", "Requests per batch.", labels=["model", "version"])
    batches = CounterMetricFamily("inferd_batches", "Batches flushed, by trigger.", labels=["model", "version", "trigger"])
    gauges = {
        "inferd_queue_depth": GaugeMetricFamily("inferd_queue_depth", "Requests waiting for a batch.", labels=["model", "version", "tier"]),
        "inferd_queue_oldest_age_seconds": GaugeMetricFamily(
            "inferd_queue_oldest_age_seconds", "Age of the oldest waiting request.", labels=["model", "version", "tier"]),
        "inferd_batches_in_flight": GaugeMetricFamily("inferd_batches_in_flight", "Batches in backend calls.", labels=["model", "version"]),
        "inferd_workers_healthy": GaugeMetricFamily("inferd_workers_healthy", "Workers built, warm, running.", labels=["model", "version"]),
        "inferd_workers": GaugeMetricFamily("inferd_workers", "Configured workers.", labels=["model", "version"]),
        "inferd_capacity_requests_per_second": GaugeMetricFamily(
            "inferd_capacity_requests_per_second", "Requests/s the healthy workers sustain, measured.", labels=["model", "version"]),
        "inferd_predicted_wait_seconds": GaugeMetricFamily(
            "inferd_predicted_wait_seconds", "Predicted wait of a request queued now: the scaling signal.", labels=["model", "version"]),
        "inferd_admission_margin_ratio": GaugeMetricFamily(
            "inferd_admission_margin_ratio", "What admission adds to one batch's estimate, as a share of it: the recent "
            "99th percentile of batches' excess over their estimates.", labels=["model", "version"]),
    }
    deaths = CounterMetricFamily("inferd_worker_deaths", "Workers whose thread died (replaced at once, or after a "
                                 "back-off when the replacement before died within a minute of its start).", labels=["model", "version"])
    holds = CounterMetricFamily("inferd_echo_holds", "Free workers held for a closed loop's echo, by how the hold ended "
                                "(back: its clients came back; cut: the batch left before, at the linger of the "
                                "first to come back, full or for a deadline).",
                                labels=["model", "version", "ended"])
    held = CounterMetricFamily("inferd_echo_hold_seconds", "Time free workers were held for a closed loop's echo.",
                               labels=["model", "version"])
    collapsed = CounterMetricFamily("inferd_collapsed_requests", "Requests answered by an identical request's computation.",
                                    labels=["model", "version"])
    cache_requests = CounterMetricFamily("inferd_cache_requests", "Result cache look-ups, by result.",
                                         labels=["model", "version", "result"])
    cache_removals = CounterMetricFamily("inferd_cache_removals", "Result cache entries removed, by reason.",
                                         labels=["model", "version", "reason"])
    cache_bytes = GaugeMetricFamily("inferd_cache_bytes", "Bytes held by the result cache.", labels=["model", "version"])
    cache_entries = GaugeMetricFamily("inferd_cache_entries", "Entries in the result cache.", labels=["model", "version"])
    busy = GaugeMetricFamily("inferd_worker_busy_ratio", "Share of the last window a worker spent in backend calls.",
                             labels=["model", "version", "worker"])
    for m in models:
        h = Histogram(BATCH_SIZE_BUCKETS)
        for size, n in m.batch_sizes.items():
            h.counts[bisect_left(h.bounds, size)] += n
            h.sum += size * n
        sizes.add_metric([m.name, m.version], h.cumulative(), h.sum)
        for trigger, n in m.flushes.items():
            batches.add_metric([m.name, m.version, trigger], n)
        for tier, depth in m.waiting_by_tier.items():
            gauges["inferd_queue_depth"].add_metric([m.name, m.version, tier], depth)
            gauges["inferd_queue_oldest_age_seconds"].add_metric([m.name, m.version, tier], m.oldest_age_by_tier.get(tier, 0.0))
        gauges["inferd_batches_in_flight"].add_metric([m.name, m.version], sum(1 for w in m.workers if w.running_requests))
        gauges["inferd_workers_healthy"].add_metric([m.name, m.version], m.healthy_workers)
        gauges["inferd_workers"].add_metric([m.name, m.version], len(m.workers))
        gauges["inferd_capacity_requests_per_second"].add_metric([m.name, m.version], m.capacity_rps)
        gauges["inferd_predicted_wait_seconds"].add_metric([m.name, m.version], min(m.predicted_wait_s, 1e9))
        gauges["inferd_admission_margin_ratio"].add_metric([m.name, m.version], m.admission_margin)
        deaths.add_metric([m.name, m.version], m.worker_deaths)
        back, cut, held_s = m.echo_holds
        holds.add_metric([m.name, m.version, "back"], back)
        holds.add_metric([m.name, m.version, "cut"], cut)
        held.add_metric([m.name, m.version], held_s)
        for w in m.workers:
            busy.add_metric([m.name, m.version, w.name], w.busy_ratio)
    for m in (*models, *retired):
        collapsed.add_metric([m.name, m.version], m.collapsed)
        if m.cache is not None:
            cache_requests.add_metric([m.name, m.version, "hit"], m.cache.hits)
            cache_requests.add_metric([m.name, m.version, "miss"], m.cache.misses)
            cache_removals.add_metric([m.name, m.version, "evicted"], m.cache.evictions)
            cache_removals.add_metric([m.name, m.version, "expired"], m.cache.expirations)
    for m in models:  # (gauges: an unloaded version's cache holds nothing)
        if m.cache is not None:
            cache_bytes.add_metric([m.name, m.version], m.cache.bytes)
            cache_entries.add_metric([m.name, m.version], m.cache.entries)
    yield from (collapsed, cache_requests, cache_removals, cache_bytes, cache_entries)
    yield sizes
    yield batches
    yield deaths
    yield holds
    yield held
    yield from gauges.values()
    yield busy


def _generation_families(models: list[GenerationSnapshot]) -> Iterator[Metric]:
    yield _histograms("inferd_generation_time_to_first_token_seconds", "From arrival to the first generated token.",
                      {g.name: g.ttft for g in models})
    yield _histograms("inferd_generation_time_per_output_token_seconds", "Time between generated tokens.",
                      {g.name: g.time_per_output_token for g in models})
    tokens = CounterMetricFamily("inferd_generation_tokens", "Tokens processed (rate: tokens per second).",
                                 labels=["model", "kind"])
    aborts = CounterMetricFamily("inferd_generation_aborts", "Requests aborted in the engine, by reason.",
                                 labels=["model", "reason"])
    requests = GaugeMetricFamily("inferd_generation_requests", "Requests by state: waiting means no token yet.",
                                 labels=["model", "state"])
    engine = GaugeMetricFamily("inferd_generation_engine_requests", "The engine scheduler's own counts.",
                               labels=["model", "state"])
    kv = GaugeMetricFamily("inferd_generation_kv_cache_usage_ratio", "Share of the KV cache in use.", labels=["model"])
    for g in models:
        tokens.add_metric([g.name, "output"], g.output_tokens)
        tokens.add_metric([g.name, "prompt"], g.prompt_tokens)
        for reason, n in g.aborts.items():
            aborts.add_metric([g.name, reason], n)
        requests.add_metric([g.name, "waiting"], g.waiting)
        requests.add_metric([g.name, "running"], g.running)
        engine.add_metric([g.name, "waiting"], g.engine_waiting)
        engine.add_metric([g.name, "running"], g.engine_running)
        kv.add_metric([g.name], g.kv_cache_usage)
    yield from (tokens, aborts, requests, engine, kv)
    yield from _admission_families(models)
    yield from _vllm_families(models)


def _admission_families(models: list[GenerationSnapshot]) -> Iterator[Metric]:
    """What generation's admission predicts and refuses."""
    refusals = CounterMetricFamily("inferd_generation_refusals", "Generation requests refused at admission, by reason.",
                                   labels=["model", "reason"])
    predicted = GaugeMetricFamily("inferd_generation_predicted_ttft_seconds",
                                  "Time to first token a new request of the lowest tier would be promised now, margin included.",
                                  labels=["model"])
    objective = GaugeMetricFamily("inferd_generation_ttft_objective_seconds", "The model's time-to-first-token objective.",
                                  labels=["model"])
    preemptions = CounterMetricFamily("inferd_generation_preemptions", "Sequences the engine preempted.", labels=["model"])
    demand = GaugeMetricFamily("inferd_generation_demand_sequences",
                               "Sequences asked of the engine at once: running, waiting, and the refused at their rate "
                               "times the seconds each would have run (what an autoscaler divides by the places).",
                               labels=["model"])
    places = GaugeMetricFamily("inferd_generation_places", "Sequences the engine runs at once.", labels=["model"])
    for g in models:
        demand.add_metric([g.name], g.demand)
        if g.places:
            places.add_metric([g.name], g.places)
        for reason, n in g.refusals.items():
            refusals.add_metric([g.name, reason], n)
        predicted.add_metric([g.name], g.predicted_ttft_s)
        if g.ttft_slo_s is not None:
            objective.add_metric([g.name], g.ttft_slo_s)
        preemptions.add_metric([g.name], g.preemptions)
    yield from (refusals, predicted, objective, preemptions, demand, places)
    yield _histograms("inferd_generation_ttft_prediction_ratio", "Actual over predicted time to first token, at the first token.",
                      {g.name: g.ttft_prediction for g in models if g.ttft_prediction is not None})


def _vllm_families(models: list[GenerationSnapshot]) -> Iterator[Metric]:
    """The same figures under the names vLLM's own server exports (label `model_name`), so that vLLM's
    dashboards and the Gateway API Inference Extension's endpoint picker read inferd unchanged."""
    running = GaugeMetricFamily("vllm:num_requests_running", "Requests running in the engine.", labels=["model_name"])
    waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for the engine.", labels=["model_name"])
    kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).", labels=["model_name"])
    preemptions = CounterMetricFamily("vllm:num_preemptions", "Cumulative preemptions.", labels=["model_name"])
    prompt = CounterMetricFamily("vllm:prompt_tokens", "Prefill tokens processed.", labels=["model_name"])
    generation = CounterMetricFamily("vllm:generation_tokens", "Generation tokens processed.", labels=["model_name"])
    for g in models:
        running.add_metric([g.name], g.running)
        waiting.add_metric([g.name], g.waiting)
        kv.add_metric([g.name], g.kv_cache_usage)
        preemptions.add_metric([g.name], g.preemptions)
        prompt.add_metric([g.name], g.prompt_tokens)
        generation.add_metric([g.name], g.output_tokens)
    yield from (running, waiting, kv, preemptions, prompt, generation)
    for name, doc, per_model in (
            ("vllm:time_to_first_token_seconds", "Time to first token.", {g.name: g.ttft for g in models}),
            ("vllm:time_per_output_token_seconds", "Time per output token.", {g.name: g.time_per_output_token for g in models}),
            ("vllm:inter_token_latency_seconds", "Time between tokens.", {g.name: g.time_per_output_token for g in models})):
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        for model, h in per_model.items():
            family.add_metric([model], h.cumulative(), h.sum)
        yield family


def _histograms(name: str, doc: str, per_model: dict, *more_labels: str) -> HistogramMetricFamily:
    """A histogram per model (or per model and version: keys are then tuples)."""
    family = HistogramMetricFamily(name, doc, labels=["model", *more_labels])
    for key, h in list(per_model.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], h.cumulative(), h.sum)
    return family


def build_registry(collector: InferdCollector) -> CollectorRegistry:
    """A registry of this server's own (no process-global state), with the standard process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry
