"""What a batch costs: the time of one backend call, per length bucket and batch size, measured.

The seed's function costs the same whatever the batch; a real model does not (MiniLM on two CPU cores:
12 ms for one short input, 2.2 s for 32 inputs of 256 tokens). Everything that predicts a wait or sizes
a batch asks this table, so it is learned from what runs, never configured:

- at warm-up, a backend that declares its shapes is timed at a few sizes per bucket (`executor`), or
  tells its own costs (`cost(batch_size, bucket)`, e.g. the CUDA graphs it captured);
- then every batch run updates its cell (bucket, size), and a level shared by all cells: a model that
  gets twice as slow (another process on the GPU, a throttled clock) moves every estimate within a few
  batches, not only the shapes that happen to run.

An estimate is `level x shape`: a cell's shape is the mean of its own observations (a running mean,
then a slow moving one), the level a fast moving mean of how far observations have been from their
cells. Sizes never run are interpolated between the measured ones of their bucket (flat below the
smallest, above the largest the slope from the smallest to the largest), and never cost less than a
smaller size. A bucket never run borrows the nearest measured bucket's curve.

One odd batch must not lock the estimates in a state nothing corrects (a cell's first batch, slowed by
one very long input, once made every larger size cost 5 s, so that none of them ran again): a cell's
first observation is taken within a factor of two of what the curve predicted there, the first few
teach their cell alone (their mean: `SETTLING_RUNS`), and a later one moves the level and its cell by
at most a factor of two; a real change is followed within a few batches all the same. How far settled
cells' batches ran from their estimates is kept apart (`prediction_errors`): it makes the margin
predictions add, calibrated on what happened and fading with time (an unsettled cell's errors are its
own learning, not noise). Nor may a size that looked slow stay unmeasured for good: where a bucket's
batches stop short of `max_batch_size` without an objective, the batcher lets one in `PROBE_EVERY` grow
past the limit, and a batch past it moves its cell half way to what it took (the cell is stale, not
noisy: neither the level nor a margin learns from it).

While short calls share the model with large ones (the batcher says so: `set_short_calls_beside_large`),
a batch without an objective stops at the *smallest* size with 95% of the best throughput instead of
the largest: the same bound on throughput, and the batch running, which a short call arriving waits
for, as short as that bound allows (S15's cross-encoder on a CPU: ~10 long pairs, 0.15 s, where the
largest was ~30, 0.45 s). Bulk work alone still fills to the largest.

Thread-safety: written on the event loop only; read by the batcher under its lock from worker threads.
Readers see either a bucket's old curve or its new one (each is replaced whole), never half of one.

Why one module: the cells, the curves made from them and the size limits read off the curves change
together after every batch, under one revision that every reader's derived figures key on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .prediction_errors import PredictionErrors

LEVEL_ALPHA = 0.3  # how fast the level follows (a 2x slowdown: within 10% in about 8 batches)
CELL_ALPHA = 0.05  # how fast a cell's shape moves once it has 20 observations (before: their mean)
MAX_STEP = math.log(2.0)  # one observation moves the level, or its cell, by at most 2x
SETTLING_RUNS = 3  # a cell's first observations teach it alone; the level learns from the later ones
THROUGHPUT_LOSS = 0.05  # the most a useful batch size gives up against the best throughput
PROBE_STEP = 0.5  # a batch past the size limit moves its (stale) cell half way to what it took


@dataclass(slots=True)
class _Cell:
    shape: float  # seconds at level 1.0
    runs: int


class BatchCosts:
    """The cost of a batch of `size` requests of length bucket `bucket`, for one model version.

    `slo_s`: the model's latency objective, if any. `size_limit` is the largest *useful* batch: without
    an objective where throughput stops growing (`_sizes_without_objective`; while short calls come
    beside large ones, where it reaches 95% of the best), with one the size that fits it and gives up at
    most 5% of throughput for latency (`_useful_size`)."""

    def __init__(self, max_batch_size: int, slo_s: float | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.slo_s = slo_s
        self.level = 1.0
        self.batches = 0  # observations since start (warm-up measurements included)
        self.errors = PredictionErrors()  # how far batches ran from their estimates: the margins
        self._cells: dict[int, dict[int, _Cell]] = {}
        self._curves: dict[int, list[float]] = {}  # by bucket: shape by size (index 0: 0.0), at level 1.0
        # by bucket: the size a batch stops at, and the shape of a batch of that size; each kept for bulk
        # work alone (`_top_*`) and for short calls beside large ones (`_knee_*`), `_limits` and `_full`
        # being the pair in force (`set_short_calls_beside_large`)
        self._top_limits: dict[int, int] = {}
        self._top_full: dict[int, float] = {}
        self._knee_limits: dict[int, int] = {}
        self._knee_full: dict[int, float] = {}
        self._limits, self._full = self._top_limits, self._top_full
        self.short_calls_beside_large = False
        self._largest: dict[int, int] = {}  # by bucket: the largest size measured
        self._costliest = 0.0  # the largest of `_full`
        self.revision = 0  # moves on whenever an estimate may have changed (what readers derive holds until then)

    # ---- learning (on the event loop) ------------------------------------------------------------

    def measured(self, shapes: Iterable[tuple[int, int, float]]) -> None:
        """Warm-up measurements (or a backend's own figures), (bucket, size, seconds) each: they set their
        cells and move nothing else."""
        touched = set()
        for bucket, size, seconds in shapes:
            if seconds > 0 and 1 <= size <= self.max_batch_size:
                self._cells.setdefault(bucket, {})[size] = _Cell(seconds / self.level, 1)
                self.batches += 1
                touched.add(bucket)
        for bucket in touched:
            self._refresh(bucket)

    def observe(self, bucket: int, size: int, seconds: float, at: float) -> None:
        """A batch of `size` requests of `bucket` ran in `seconds`, ending at `at` (the model's clock)."""
        if seconds <= 0 or not 1 <= size <= self.max_batch_size:
            return
        self.batches += 1
        cells = self._cells.setdefault(bucket, {})
        cell = cells.get(size)
        if cell is None:  # a new shape: within a factor of two of what the curve predicted there, if anything
            prior = self.estimate(size, bucket)
            if prior:  # (what interpolation got wrong is its cell's to learn: neither the level's, nor a margin's)
                seconds = _within_step(seconds, prior)
            cells[size] = _Cell(seconds / self.level, 1)
            self.errors.refresh(at)
            self._refresh(bucket)
            return
        expected = cell.shape * self.level
        cell.runs += 1
        if cell.runs <= SETTLING_RUNS:  # still settling: the mean of its observations, wrong on its own account
            cell.shape += (seconds / self.level - cell.shape) / cell.runs
        elif size > self._top_limits.get(bucket, size):  # past the limit (a probe, a short call whole): stale, not noise
            cell.shape += PROBE_STEP * (_within_step(seconds, expected) / self.level - cell.shape)
        else:  # settled: how far it ran from its estimate is the noise a margin covers
            self.errors.observe(seconds / expected, at)
            error = max(-MAX_STEP, min(MAX_STEP, math.log(seconds / expected)))
            self.level *= math.exp(LEVEL_ALPHA * error)
            seen = _within_step(seconds, expected) / self.level
            cell.shape += max(CELL_ALPHA, 1.0 / cell.runs) * (seen - cell.shape)
        self.errors.refresh(at)
        self._refresh(bucket)

    def refresh_margins(self, now: float) -> None:
        """Bring the margins up to `now` (they fade with time, batches or none): the revision moves on
        when they changed."""
        if self.errors.refresh(now):
            self.revision += 1

    def set_short_calls_beside_large(self, on: bool) -> None:
        """Whether short calls now share the model with large ones: batches without an objective stop
        at the smallest size with 95% of the best throughput (`on`) or the largest (see the module
        docstring). Every estimate derived from the limits moves with it (the revision)."""
        self.short_calls_beside_large = on
        self._limits, self._full = (self._knee_limits, self._knee_full) if on else (self._top_limits, self._top_full)
        self._costliest = max(self._full.values(), default=0.0)
        self.revision += 1

    @property
    def slack(self) -> float:
        """What one batch may take beyond its estimate, as a share of it (the 99th percentile, recently)."""
        return self.errors.batch_excess

    def _refresh(self, bucket: int) -> None:
        cells = self._cells[bucket]
        sizes = sorted(cells)
        self._largest[bucket] = sizes[-1]
        curve = _floor_curve(sizes, [cells[n].shape for n in sizes], self.max_batch_size)
        self._curves[bucket] = curve  # (replaced whole: see the module docstring)
        slo_s = self.slo_s
        if slo_s is None:
            top, knee = self._sizes_without_objective(curve)
        else:
            top = knee = self._useful_size(curve, slo_s)
        self._top_limits[bucket], self._knee_limits[bucket] = top, knee
        self._top_full[bucket], self._knee_full[bucket] = curve[top], curve[knee]
        self._costliest = max(self._full.values())
        self.revision += 1

    def _sizes_without_objective(self, curve: list[float]) -> tuple[int, int]:
        """Without an objective, the largest useful batch for bulk work is the largest size with 95% of
        the best throughput: past it a larger batch does fewer inputs a second, not more (a CPU's caches:
        a cross-encoder's 64 pairs of 128 tokens take 15% longer a pair than 16-32), so it adds only
        latency. A curve still rising or flat (a GPU's, the seed's function) fills as before. A size
        that looked slower than it is (a warm-up's one call on a noisy host) is measured again: the
        batcher's probes past the limit (`Batcher._grow_to`) move its cell half way each time.
        Beside short calls, the smallest size with 95% of the best throughput, and then as many more
        as cost no more than it (1%: a flat curve fills), but never below an eighth of `max_batch_size`:
        (largest, smallest). Why the floor: where a CPU's time per pair is flat from 2 pairs to 16, which
        size is smallest within 5% is the noise's to say; it fell to 2 pairs in one S15 run, and batches
        that small cost per-batch work the curve does not see (throughput 64 pairs/s against 80-93 at 8-9
        pairs), and a short call's inputs, prepared in two parts, went in two batches."""
        rates = [n / curve[n] for n in range(1, self.max_batch_size + 1)]  # (one pass and a max: ~3 us a batch)
        floor, top = (1 - THROUGHPUT_LOSS) * max(rates), len(rates)
        while rates[top - 1] < floor:
            top -= 1
        knee = min(top, max(1, self.max_batch_size // 8))  # (the floor, see above; never past the bulk limit)
        while knee < top and rates[knee - 1] < floor:
            knee += 1
        bound = curve[knee] * 1.01
        while knee < top and curve[knee + 1] <= bound:
            knee += 1
        return top, knee

    def _useful_size(self, curve: list[float], slo_s: float) -> int:
        """With an objective, the largest useful batch: among the sizes whose call takes at most half the
        objective (a request may wait for one batch and then run in its own), the smallest that gets
        95% of the best throughput there, and then as many more as cost no more than it (1%: a flat
        curve, or a GPU's padded shape, fills for free). Past it a batch adds latency for next to no
        throughput."""
        level = self.level
        # (the curve never falls: the sizes that fit are 1..fits, and those within 1% of the knee's cost
        # a run from the knee up; one pass each, asked after every batch)
        fits, best = 0, 0.0
        for n in range(1, self.max_batch_size + 1):
            if 2 * curve[n] * level > slo_s:
                break
            fits = n
            if n / curve[n] > best:
                best = n / curve[n]
        if not fits:
            return 1
        knee = next(n for n in range(1, fits + 1) if n / curve[n] >= (1 - THROUGHPUT_LOSS) * best)
        limit, bound = knee, curve[knee] * 1.01
        while limit < fits and curve[limit + 1] <= bound:
            limit += 1
        return limit

    # ---- reading (any thread) --------------------------------------------------------------------

    def curve(self, bucket: int) -> list[float] | None:
        """Shapes by size (index 0 unused) for `bucket`, at level 1.0: multiply by `level`. A bucket
        never measured borrows the nearest shorter bucket's curve (the nearest longer one when none is
        shorter): an optimistic guess, which its first batches correct. None: nothing measured at all."""
        curve = self._curves.get(bucket)
        if curve is None and self._curves:
            curve = self._curves[self._nearest(bucket)]
        return curve

    def _nearest(self, bucket: int) -> int:
        known = sorted(self._curves)
        below = [b for b in known if b < bucket]
        return below[-1] if below else known[0]

    def estimate(self, size: int, bucket: int) -> float:
        """Seconds a batch of `size` requests of `bucket` is expected to take (0.0: nothing measured)."""
        curve = self._curves.get(bucket) or self.curve(bucket)
        if curve is None:
            return 0.0
        return curve[size if 0 < size <= self.max_batch_size else max(1, min(size, self.max_batch_size))] * self.level

    def learning(self, size: int, bucket: int) -> bool:
        """Whether the cost of a batch of `size` requests of `bucket` is still being learned: a shape never
        run, or in its first `SETTLING_RUNS` (from warm-up too). How far such a batch runs from its estimate
        is its cell's own lesson, not the noise a margin covers (`observe`)."""
        cells = self._cells.get(bucket)
        cell = cells.get(size) if cells else None
        return cell is None or cell.runs < SETTLING_RUNS

    def safe_estimate(self, size: int, bucket: int) -> float:
        """What a batch may take, for decisions that must not be late: `estimate` with one batch's margin."""
        return self.estimate(size, bucket) * (1.0 + self.errors.batch_excess)

    def margin_s(self, total_s: float, batch_s: float, deadline: bool = False) -> float:
        """What a prediction of `total_s` seconds of batches (each up to `batch_s`) adds to hold at the
        99th percentile, or for a `deadline` alone the 90th (`PredictionErrors.margin_s`)."""
        return self.errors.margin_s(total_s, batch_s, deadline)

    def full_batch_s(self, bucket: int) -> float:
        """What a batch of `bucket` at its size limit is expected to take (0.0: nothing measured)."""
        full = self._full.get(bucket)
        if full is None:
            return self.estimate(self.size_limit(bucket), bucket)
        return full * self.level

    def costliest_batch_s(self) -> float:
        """What the costliest full batch of any bucket is expected to take (0.0: nothing measured)."""
        return self._costliest * self.level

    def size_limit(self, bucket: int) -> int:
        """Where a batch of `bucket` stops growing: its largest useful batch (nothing measured:
        `max_batch_size`; a bucket never measured: the one whose curve it borrows)."""
        limit = self._limits.get(bucket)
        if limit is None:
            return self._limits[self._nearest(bucket)] if self._limits else self.max_batch_size
        return limit

    def largest_measured(self, bucket: int) -> int:
        """The largest batch of `bucket` measured (at warm-up or run); 0: none. (Kept by `_refresh`: asked
        for every request admission asks.)"""
        return self._largest.get(bucket, 0)

    def describe(self) -> dict[str, Any]:
        """The curve as `GET /v1/models` shows it: per bucket, the estimate (ms) and runs of every measured
        size, and the size a batch stops at (now: beside short calls, or not)."""
        return {
            "level": round(self.level, 4), "slack": round(self.slack, 4), "margin": self.errors.describe(),
            "batches": self.batches, "short_calls_beside_large": self.short_calls_beside_large,
            "buckets": {
                str(bucket): {
                    "size_limit": self.size_limit(bucket),
                    "sizes": {str(n): {"ms": round(self.estimate(n, bucket) * 1000, 3), "runs": cells[n].runs}
                              for n in sorted(cells)},
                }
                for bucket, cells in sorted(self._cells.items())
            },
        }

    def measured_shapes(self) -> list[tuple[int, int, float]]:
        """(bucket, size, estimated seconds) of every measured shape: for the metrics exporter."""
        return [(b, n, cells[n].shape * self.level) for b, cells in sorted(self._cells.items()) for n in sorted(cells)]


def _within_step(seconds: float, expected: float) -> float:
    """`seconds`, brought within a factor of e^MAX_STEP of `expected`."""
    bound = math.exp(MAX_STEP)
    return min(expected * bound, max(expected / bound, seconds))


def _floor_curve(sizes: list[int], shapes: list[float], max_size: int) -> list[float]:
    """The shape at every size 1..max_size (index 0: 0.0) from the measured sizes: flat below the first,
    straight between two, past the last the slope from the first to the last (never negative); then never lower than at a
    smaller size. Built in one pass over the sizes (rebuilt after every batch: a bisection per size
    made this most of a batch's own cost on the loop, ~50 us, measured)."""
    curve = [0.0] * (max_size + 1)
    last = len(sizes) - 1
    # past the last measured size: the slope across every measured size, first to last (two neighbours'
    # slope, 7 and 8 on a busy CPU, once made 32 cost 8 s where it took 4)
    slope = max(0.0, (shapes[-1] - shapes[0]) / (sizes[-1] - sizes[0])) if last else 0.0
    floor, i = 0.0, 0  # i: the first measured size >= n
    for n in range(1, max_size + 1):
        while i <= last and sizes[i] < n:
            i += 1
        if i > last:
            value = shapes[-1] + slope * (n - sizes[-1])
        elif sizes[i] == n or i == 0:
            value = shapes[i]
        else:
            lo, hi = sizes[i - 1], sizes[i]
            value = shapes[i - 1] + (shapes[i] - shapes[i - 1]) * (n - lo) / (hi - lo)
        if value > floor:
            floor = value
        curve[n] = floor
    return curve
