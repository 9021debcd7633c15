"""`inferd plan` on what a server recorded: the arrivals of its access log, and a model's measured batch
costs and settings as `GET /v1/models/{name}` reports them, instead of a synthetic day and device.

An access-log line is written when a request ends: its arrival is its `ts` less its `latency_ms`. The log
says nothing of an input's length bucket, so a recorded day is planned in one bucket (the measured curve
of bucket 0), and every request at the model's own objective (tiers are not replayed).
"""

from __future__ import annotations

import bisect
import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .traces import Arrival


@dataclass(frozen=True)
class MeasuredDevice:
    """A device that takes what the model's cost model estimates: per bucket, the estimate at each
    measured size, straight between two, past the last by the slope from the first to the last, flat
    below the first (as `BatchCosts` reads its own curve); a bucket never measured costs as bucket 0."""

    curves: dict[int, tuple[tuple[int, float], ...]]  # bucket -> ((size, seconds), ...) by size

    def __call__(self, size: int, bucket: int) -> float:
        points = self.curves.get(bucket) or self.curves[min(self.curves)]
        sizes = [n for n, _ in points]
        if size <= sizes[0] or len(points) == 1:
            return points[0][1]
        at = bisect.bisect_left(sizes, size)
        if at < len(points):
            (n0, s0), (n1, s1) = points[at - 1], points[at]
            return s0 + (s1 - s0) * (size - n0) / (n1 - n0)
        (first_n, first_s), (last_n, last_s) = points[0], points[-1]
        slope = max(0.0, (last_s - first_s) / (last_n - first_n))
        return last_s + slope * (size - last_n)


@dataclass(frozen=True)
class RecordedModel:
    """What the plan needs of a served model: its batch settings and its measured device."""

    name: str
    max_batch_size: int
    max_wait_ms: float
    slo_ms: float | None
    timeout_ms: float
    device: MeasuredDevice


def model_from_description(description: dict[str, Any]) -> RecordedModel:
    """From `GET /v1/models/{name}`'s answer (saved as JSON): settings and the cost model's curve."""
    buckets = description["cost_model"]["buckets"]
    curves = {int(bucket): tuple(sorted((int(n), cell["ms"] / 1000.0) for n, cell in entry["sizes"].items()))
              for bucket, entry in buckets.items() if entry["sizes"]}
    if not curves:
        raise ValueError(f"model {description.get('name')!r} has measured no batch yet: nothing to plan with")
    return RecordedModel(description["name"], int(description["max_batch_size"]), float(description["max_wait_ms"]),
                         description.get("slo_ms"), float(description["timeout_ms"]), MeasuredDevice(curves))


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


MAX_LATENCY_S = 3600.0  # a logged latency past this (or negative, or not a number) is no request's
MAX_FROM_MEDIAN_S = 7 * 86400.0  # an arrival this far from the log's median one is a clock's mistake, not a day's


def arrivals_from_access_log(lines: Iterable[str], model: str | None = None, sample_rate: float = 1.0,
                             skipped: Counter[str] | None = None) -> list[Arrival]:
    """Every request of `model` (None: of any) in the access log's JSON lines, at its arrival (its end
    less its latency), the first at 0, in order of arrival; lines that are not a request's are skipped.
    A log kept at `sample_rate` (the server's `access_log_sample_rate`) below 1 stands for 1/rate requests
    a line: each is repeated that many times (on average), spread over the second around it.

    A request's line whose latency is not a number of ms from 0 to an hour, whose timestamp cannot be
    read, or whose arrival lies more than a week from the log's median one is skipped and counted in
    `skipped` by reason (`latency`, `timestamp`, `far from the rest`): one bad line among 600 once made
    a traceback after the whole run, a 56-year day, or a plan for 24 GPU-hours instead of 0.02."""
    skipped = Counter() if skipped is None else skipped
    arrived = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or "ts" not in entry or "latency_ms" not in entry:
            continue  # (not a request's line: a start-up event, say)
        if model is not None and entry.get("model") != model:
            continue
        latency = entry["latency_ms"]
        if type(latency) not in (int, float) or not 0.0 <= latency <= MAX_LATENCY_S * 1000.0:  # (NaN fails both)
            skipped["latency"] += 1
            continue
        try:
            ended = _seconds(entry["ts"])
        except (ValueError, TypeError, AttributeError, OverflowError, OSError):
            skipped["timestamp"] += 1
            continue
        arrived.append(ended - latency / 1000.0)
    if arrived:
        median = statistics.median(arrived)
        kept = [at for at in arrived if abs(at - median) <= MAX_FROM_MEDIAN_S]
        if len(kept) < len(arrived):
            skipped["far from the rest"] += len(arrived) - len(kept)
        arrived = kept
    if sample_rate < 1.0:
        draws, copies = random.Random(7), 1.0 / sample_rate
        arrived = [at + (draws.random() - 0.5 if k else 0.0) for at in arrived
                   for k in range(int(copies) + (draws.random() < copies - int(copies)))]
    arrived.sort()
    first = arrived[0] if arrived else 0.0
    return [Arrival(at - first, 0) for at in arrived]


def read_access_log(path: Path, model: str | None = None, sample_rate: float = 1.0,
                    skipped: Counter[str] | None = None) -> list[Arrival]:
    with path.open(encoding="utf-8", errors="replace") as lines:
        return arrivals_from_access_log(lines, model, sample_rate, skipped)


def rate_of(arrivals: list[Arrival]) -> Callable[[float], float]:
    """The recorded rate at each second (requests that arrived within it): what the oracle plans from."""
    per_second: dict[int, int] = {}
    for arrival in arrivals:
        second = int(math.floor(arrival.at))
        per_second[second] = per_second.get(second, 0) + 1
    return lambda t: float(per_second.get(int(math.floor(t)), 0))


@dataclass(frozen=True)
class RecordedDay:
    """A recorded trace where `plan` takes a `DayTrace`: its arrivals, length and rate by second."""

    recorded: tuple[Arrival, ...]
    long_share: float = 0.0

    @property
    def day_s(self) -> float:
        return math.ceil(self.recorded[-1].at) + 1.0 if self.recorded else 1.0

    def arrivals(self) -> Iterable[Arrival]:
        return iter(self.recorded)

    @property
    def rate(self) -> Callable[[float], float]:
        return rate_of(list(self.recorded))
