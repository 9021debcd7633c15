"""Sweeps: run load steps one after another and summarise each with the server's own view of it.

The server's view (mean batch size, CPU seconds per 1,000 requests, peak RSS, batch-size distribution)
comes from inferd's `GET /v1/stats`, read before and after each step; against another server it is
simply left out.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from .loadgen import LoadSpec, Samples, fetch_stats, run_python
from .wrk import run_wrk

MAX_STEPS = 20
MAX_STEP_S = 600.0


def run_load(spec: LoadSpec, engine: str = "python") -> Samples:
    return run_wrk(spec) if engine == "wrk" else run_python(spec)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Exact percentile (nearest rank) of sorted samples; None without any (JSON has no NaN)."""
    return ranked(sorted_values, q) if sorted_values else None


def ranked(sorted_values: list[float], q: float) -> float:
    """`percentile` of samples there are."""
    rank = math.ceil(q / 100.0 * len(sorted_values))
    return sorted_values[max(0, min(len(sorted_values), rank) - 1)]


def _is_inferd_stats(stats: Any) -> bool:
    return (isinstance(stats, dict) and isinstance(stats.get("process"), dict)
            and isinstance(stats["process"].get("cpu_seconds"), (int, float)) and isinstance(stats.get("models", {}), dict))


def server_view(before: dict | None, after: dict | None, completed: int) -> dict[str, Any] | None:
    """The server's own view of a step, from inferd's /v1/stats; None for anything else (another
    server, a catch-all answering JSON of its own): that server is simply measured without it."""
    if not _is_inferd_stats(before) or not _is_inferd_stats(after):
        return None
    assert before is not None and after is not None
    cpu = after["process"]["cpu_seconds"] - before["process"]["cpu_seconds"]
    batches = requests = 0
    sizes: dict[str, int] = {}
    for name, stats in after.get("models", {}).items():
        prior = before.get("models", {}).get(name, {})
        if not isinstance(stats, dict) or not isinstance(prior, dict):
            continue
        batches += stats.get("batches", 0) - prior.get("batches", 0)
        requests += stats.get("requests_computed", 0) - prior.get("requests_computed", 0)
        for size, n in stats.get("batch_sizes", {}).items():
            delta = n - prior.get("batch_sizes", {}).get(size, 0)
            if delta:
                sizes[size] = sizes.get(size, 0) + delta
    return {
        "mean_batch_size": round(requests / batches, 2) if batches else None,
        "batches": batches,
        "cpu_seconds": round(cpu, 3),
        "cpu_s_per_1000_requests": round(cpu / completed * 1000, 4) if completed else None,
        "cpu_us_per_request": round(cpu / completed * 1e6, 1) if completed else None,
        "peak_rss_bytes": after["process"].get("max_rss_bytes"),
        "batch_sizes": sizes,
    }


def summarise(spec: LoadSpec, samples: Samples, view: dict | None) -> dict[str, Any]:
    latencies = sorted(samples.latencies_ms)
    completed = sum(v for k, v in samples.statuses.items() if k.isdigit())
    ok = samples.statuses.get("200", 0)
    lat: dict[str, float | None]
    if samples.percentiles_ms is not None:
        lat = dict(samples.percentiles_ms)
    else:
        lat = {
            "p50": percentile(latencies, 50),
            "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99),
            "p999": percentile(latencies, 99.9),
            "max": latencies[-1] if latencies else None,
            "mean": sum(latencies) / len(latencies) if latencies else None,
        }
    wall = samples.wall_s or spec.duration_s
    if samples.engine == "wrk":
        spec = replace(spec, duration_s=wall)
    return {
        "mode": spec.mode,
        "engine": samples.engine,
        "offered": spec.rate if spec.mode == "open" else spec.concurrency,
        "offered_rps": spec.rate,
        "concurrency": spec.concurrency,
        "duration_s": round(wall, 3),
        "sent": samples.sent,
        "completed": completed,
        "ok": ok,
        # Throughput counts answers inside the step's window, so the tail of in-flight requests at the
        # end neither inflates nor dilutes it.
        "achieved_rps": round(samples.in_window / spec.duration_s, 2),
        "ok_rps": round(ok / max(completed, 1) * samples.in_window / spec.duration_s, 2),
        "errors": sum(v for k, v in samples.statuses.items() if k != "200"),
        "statuses": dict(samples.statuses),
        "error_codes": dict(samples.error_codes),
        "timeouts": samples.statuses.get("timeout", 0),
        "connect_errors": samples.statuses.get("connect_error", 0),
        "latency_ms": {k: None if v is None else round(v, 3) for k, v in lat.items()},
        "connect_ms": _connect_summary(samples.connect_ms),
        "server": view,
        "generator": _generator_summary(samples.loop_lag_ms, lat.get("p50")),
    }


def _generator_summary(lag_ms: list[float], p50_ms: float | None) -> dict[str, Any] | None:
    """The Python engine's own loop lag, and whether it was busy enough to be part of what it measured:
    a p99 lag over 5 ms, or over a tenth of the requests' median latency."""
    if not lag_ms:
        return None
    ordered = sorted(lag_ms)
    p99 = ranked(ordered, 99)
    busy = p99 > 5.0 or (p50_ms is not None and p99 > 0.1 * p50_ms)
    return {"loop_lag_ms": {"p50": round(ranked(ordered, 50), 3), "p99": round(p99, 3), "max": round(ordered[-1], 3)},
            "busy": busy}


def _connect_summary(connect_ms: list[float]) -> dict[str, float] | None:
    """New connections opened in the measured part, and how long opening them took (not in latency_ms)."""
    if not connect_ms:
        return None
    ordered = sorted(connect_ms)
    return {"count": len(ordered), "p50": round(ranked(ordered, 50), 3), "p99": round(ranked(ordered, 99), 3),
            "max": round(ordered[-1], 3)}


class Progress:
    """A one-line progress bar on stderr, ticking while a step runs."""

    def __init__(self, label: str, total_s: float) -> None:
        self.label, self.total_s = label, total_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.stderr.write(f"\r{self.label} [{'#' * 30}] done{' ' * 12}\n")

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            frac = min(1.0, (time.monotonic() - self._started) / self.total_s)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac * 100:3.0f}%")
            sys.stderr.flush()


def run_step(spec: LoadSpec, engine: str, stats_url: str | None, warmup_s: float, quiet: bool = False) -> dict[str, Any]:
    if not 0 < spec.duration_s <= MAX_STEP_S:
        raise ValueError(f"a step lasts between 0 and {MAX_STEP_S:.0f} s")
    before = None
    if engine == "wrk":  # wrk cannot keep its connections across two runs: it warms up in one of its own
        if warmup_s > 0:
            run_load(replace(spec, duration_s=warmup_s, counter_start=spec.counter_start + 10**9), engine)
        before = fetch_stats(stats_url)
    else:  # the Python engine warms up on the connections it then measures with, and reads the stats between
        spec = replace(spec, warmup_s=warmup_s, stats_url=stats_url)
    label = f"{spec.mode} {'rate' if spec.mode == 'open' else 'clients'}={spec.rate or spec.concurrency}"
    if quiet:
        samples = run_load(spec, engine)
    else:
        with Progress(label, spec.warmup_s + spec.duration_s + 1):
            samples = run_load(spec, engine)
    if before is None:
        before = samples.stats_before
    after = fetch_stats(stats_url)
    completed = sum(v for k, v in samples.statuses.items() if k.isdigit())
    return summarise(spec, samples, server_view(before, after, completed))


def run_sweep(
    base: LoadSpec,
    *,
    rates: list[float] | None = None,
    concurrencies: list[int] | None = None,
    engine: str = "python",
    stats_url: str | None = None,
    warmup_s: float = 2.0,
    quiet: bool = False,
) -> list[dict[str, Any]]:
    steps = [replace(base, rate=r, concurrency=None) for r in rates or []]
    steps += [replace(base, rate=None, concurrency=c) for c in concurrencies or []]
    if not 0 < len(steps) <= MAX_STEPS:
        raise ValueError(f"a sweep has 1 to {MAX_STEPS} steps")
    results = []
    for n, spec in enumerate(steps):
        spec = replace(spec, counter_start=n * 10**10)
        results.append(run_step(spec, engine, stats_url, warmup_s, quiet))
    return results
