"""The exporter: request metrics and model snapshots in, Prometheus text out, without any model."""

from __future__ import annotations

import platform

from prometheus_client import generate_latest

from inferd import __version__
from inferd.observability.histogram import Histogram
from inferd.observability.metrics import InferdCollector, RequestMetrics, build_registry
from inferd.observability.snapshots import BatchModelSnapshot, WorkerSnapshot


def snapshot() -> BatchModelSnapshot:
    compute = Histogram()
    compute.observe(0.01)
    return BatchModelSnapshot(
        name="m", version="1", takes_traffic=True, ready=True, waiting_by_tier={"free": 3, "paid": 1}, oldest_age_by_tier={"free": 0.2},
        workers=(WorkerSnapshot("m-0", 0.75, 16), WorkerSnapshot("m-1", 0.5, 0)), healthy_workers=2,
        capacity_rps=2000.0, predicted_wait_s=0.04, queue_wait=Histogram(), linger=Histogram(), compute=compute,
        batch_sizes={16: 3, 100: 1}, flushes={"full": 1, "linger": 3},
    )


def test_snapshots_become_the_documented_series():
    requests = RequestMetrics()
    requests.requests[("m", "1", "free", 200, "")] += 5
    requests.refused[("m", "free", "queue_full")] += 2
    requests.shed[("m", "free", "for_lighter_tenant")] += 1
    requests.expired[("m", "free", "queued")] += 3
    collector = InferdCollector(requests, lambda: ([snapshot()], []), lambda: True)
    text = generate_latest(build_registry(collector)).decode()
    for line in (
        'inferd_requests_total{code="200",error="",model="m",tier="free",version="1"} 5.0',
        'inferd_refused_total{model="m",reason="queue_full",tier="free"} 2.0',
        'inferd_shed_total{model="m",reason="for_lighter_tenant",tier="free"} 1.0',
        'inferd_expired_total{model="m",tier="free",where="queued"} 3.0',
        'inferd_queue_depth{model="m",tier="free",version="1"} 3.0',
        'inferd_queue_oldest_age_seconds{model="m",tier="free",version="1"} 0.2',
        'inferd_batches_in_flight{model="m",version="1"} 1.0',
        'inferd_worker_busy_ratio{model="m",version="1",worker="m-0"} 0.75',
        'inferd_batches_total{model="m",trigger="linger",version="1"} 3.0',
        'inferd_batch_size_bucket{le="16.0",model="m",version="1"} 3.0',
        'inferd_batch_size_count{model="m",version="1"} 4.0',
        'inferd_compute_seconds_count{model="m",version="1"} 1.0',
        "inferd_requests_waiting 4.0",
        "inferd_requests_running 16.0",
        "inferd_predicted_wait_max_seconds 0.04",
        "inferd_ready 1.0",
        f'inferd_build_info{{python="{platform.python_version()}",version="{__version__}"}} 1.0',
    ):
        assert line in text, line


def test_an_unloaded_versions_counters_stay_and_its_gauges_go():
    from dataclasses import replace

    from inferd.observability.snapshots import CacheSnapshot

    requests = RequestMetrics()
    gone = replace(snapshot(), version="1", collapsed=7, cache=CacheSnapshot(hits=5, misses=2, evictions=1, expirations=0,
                                                                             bytes=100, entries=3))
    requests.retired[("m", "1")] = gone
    live = replace(snapshot(), version="2")
    text = generate_latest(build_registry(InferdCollector(requests, lambda: ([live], []), lambda: True))).decode()
    assert 'inferd_collapsed_requests_total{model="m",version="1"} 7.0' in text
    assert 'inferd_cache_requests_total{model="m",result="hit",version="1"} 5.0' in text
    assert 'inferd_cache_entries{model="m",version="1"}' not in text  # (a gone cache holds nothing)
    assert 'inferd_queue_depth{model="m",tier="free",version="1"}' not in text
    reloaded = generate_latest(build_registry(InferdCollector(requests, lambda: ([snapshot()], []), lambda: True))).decode()
    assert reloaded.count('inferd_collapsed_requests_total{model="m",version="1"}') == 1  # loaded again: the live one
