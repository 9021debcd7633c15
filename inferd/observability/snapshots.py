"""What a model tells the metrics exporter at scrape time: plain values and its own histograms.

The exporter reads these and nothing else, so it never reaches into a model's batcher, workers or
engine, and a scrape never waits on a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .histogram import Histogram


class GenerationMetrics:
    """A generation model's own figures, recorded on the event loop as its requests go (its
    `GenerationSnapshot` is read from them at scrape time)."""

    def __init__(self) -> None:
        self.ttft = Histogram()
        self.time_per_output_token = Histogram((0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.aborts: dict[str, int] = {}
        self.refusals: dict[str, int] = {}  # by reason: queue_full, ttft_objective, tpot_objective
        self.ttft_prediction = Histogram((0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0))  # actual / predicted


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One executor thread, as the exporter sees it."""

    name: str
    busy_ratio: float  # share of the last ~10 s inside backend calls
    running_requests: int  # in the batch it is computing now (0: none)


@dataclass(frozen=True, slots=True)
class CacheSnapshot:
    """A batch model's result cache."""

    hits: int
    misses: int
    evictions: int  # for room
    expirations: int  # past their time to live
    bytes: int
    entries: int


@dataclass(frozen=True, slots=True)
class BatchModelSnapshot:
    """One batch model version, as the exporter sees it at a scrape."""

    name: str
    version: str
    takes_traffic: bool  # in its model's split (the pod-level signals count only these)
    ready: bool
    waiting_by_tier: dict[str, int]
    oldest_age_by_tier: dict[str, float]
    workers: tuple[WorkerSnapshot, ...]
    healthy_workers: int
    capacity_rps: float
    predicted_wait_s: float
    queue_wait: Histogram
    linger: Histogram
    compute: Histogram
    batch_sizes: dict[int, int]
    flushes: dict[str, int]
    collapsed: int = 0  # requests answered by an identical request's computation
    cache: CacheSnapshot | None = None  # None: the model has no result cache
    batch_costs: tuple[tuple[int, int, float], ...] = ()  # (bucket, size, estimated seconds) of each measured shape
    wait_error: dict[str, Histogram] = field(default_factory=dict)  # by tier: actual - predicted wait
    admission_margin: float = 0.0  # what admission adds to one batch's estimate, as a share of it (the 99th percentile)
    worker_deaths: int = 0  # workers whose thread died
    echo_holds: tuple[int, int, float] = (0, 0, 0.0)  # free workers held for a closed loop's echo: (came back, cut, seconds)
    input_tokens: Histogram | None = None  # tokens per computed input (None: its backend counts none)

    @property
    def waiting(self) -> int:
        return sum(self.waiting_by_tier.values())


@dataclass(frozen=True, slots=True)
class GenerationSnapshot:
    """One generation model, as the exporter sees it at a scrape."""

    name: str
    ready: bool
    ttft: Histogram
    time_per_output_token: Histogram
    prompt_tokens: int
    output_tokens: int
    waiting: int  # admitted, no first token yet
    running: int
    engine_waiting: int
    engine_running: int
    kv_cache_usage: float
    aborts: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)  # by reason
    preemptions: int = 0
    predicted_ttft_s: float = 0.0  # a new request of the lowest priority, now (its margin included)
    ttft_slo_s: float | None = None  # the model's objective (None: none)
    ttft_prediction: Histogram | None = None  # actual / predicted TTFT
    demand: float = 0.0  # sequences asked of the engine at once, refused ones included (`EngineBook.demand`)
    places: int = 0  # sequences the engine runs at once (0: not known)
