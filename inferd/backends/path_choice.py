"""Per batch, the cheaper way to run it: a captured CUDA graph, or an eager forward.

A graph replays its whole forward in one call (no launch needs the GIL), but at its captured shape: a
batch is padded up to the smallest captured (batch size, length) that holds it. An eager forward
launches kernel by kernel, at the batch's own rows and its longest input. Which is faster depends on
the batch: on an H200 a BERT-large batch of 126 inputs of ~190 tokens took 46.5 ms as the 256-token
graph and 31.1 ms eagerly, while small batches are several times faster as graphs. So both are
measured and each batch goes the cheaper way:

- each captured graph's replay time, timed at warm-up and then followed by every replay of it;
- an eager forward's time as `overhead + per_token x rows x longest`, fitted at warm-up on eager calls
  at the captured shapes (least squares), then scaled by how far eager calls ran from it (a moving
  ratio), so a wrong fit is corrected by the calls it sends eagerly.

A path never tried since warm-up for a shape could stay wrongly costed for good; one call in
`EXPLORE_EVERY` of a shape whose two estimates are within `CLOSE` of each other goes the other way.
Pure arithmetic on what it is told: the backend times its calls and reports them.
"""

from __future__ import annotations

from collections.abc import Iterable

ALPHA = 0.1  # how fast a shape's replay time and the eager ratio follow new calls
CLOSE = 1.25  # two estimates within this factor of each other are worth checking now and then...
EXPLORE_EVERY = 64  # ...one call in this many


class PathChoice:
    """Graph or eager, by measured times, for one backend's captured shapes."""

    def __init__(self) -> None:
        self._graph_s: dict[tuple[int, int], float] = {}  # replay seconds by captured shape
        self._overhead_s = 0.0  # the eager fit: overhead + per_token x rows x longest...
        self._per_token_s = 0.0
        self._eager_ratio = 1.0  # ...times how far eager calls have run from it lately
        self._close_calls = 0
        self.chosen = {"graph": 0, "eager": 0}

    @property
    def measured(self) -> bool:
        return bool(self._graph_s) and self._per_token_s > 0.0

    def learn_warmup(self, graphs: Iterable[tuple[int, int, float]], eager: Iterable[tuple[int, int, float]]) -> None:
        """Warm-up timings: (batch size, length, seconds) of each graph's replay and of eager calls."""
        for b, s, seconds in graphs:
            self._graph_s[(b, s)] = seconds
        points = [(b * s, seconds) for b, s, seconds in eager]
        if len(points) >= 2:
            n = len(points)
            mean_x = sum(x for x, _ in points) / n
            mean_y = sum(y for _, y in points) / n
            var = sum((x - mean_x) ** 2 for x, _ in points)
            slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
            self._per_token_s = max(slope, 1e-12)
            self._overhead_s = max(0.0, mean_y - self._per_token_s * mean_x)
        elif points:
            (x, y), = points
            self._per_token_s = y / x

    def eager_s(self, rows: int, longest: int) -> float:
        """What an eager forward of `rows` inputs of up to `longest` tokens is expected to take."""
        return (self._overhead_s + self._per_token_s * rows * longest) * self._eager_ratio

    def graph_s(self, shape: tuple[int, int]) -> float | None:
        return self._graph_s.get(shape)

    def use_graph(self, shape: tuple[int, int] | None, rows: int, longest: int) -> bool:
        """Whether the batch runs as the graph of `shape` (None: no captured shape holds it: eager)."""
        graph = self._graph_s.get(shape) if shape is not None else None
        if graph is None:
            return False
        if not self._per_token_s:
            return True  # eager never measured: the graph, as before measurements existed
        eager = self.eager_s(rows, longest)
        choice = graph <= eager
        if max(graph, eager) <= CLOSE * min(graph, eager):
            self._close_calls += 1
            if self._close_calls % EXPLORE_EVERY == 0:
                choice = not choice  # (a close call: the other way, now and then, so both stay measured)
        self.chosen["graph" if choice else "eager"] += 1
        return choice

    def ran(self, shape: tuple[int, int] | None, rows: int, longest: int, seconds: float) -> None:
        """A batch's time on the device: as `shape`'s graph, or (None) eagerly at `rows` x `longest`."""
        if shape is not None:
            self.ran_graph(shape, seconds)
        else:
            self.ran_eager(rows, longest, seconds)

    def ran_graph(self, shape: tuple[int, int], seconds: float) -> None:
        known = self._graph_s.get(shape)
        if known is not None and seconds > 0:
            self._graph_s[shape] = known + ALPHA * (seconds - known)

    def ran_eager(self, rows: int, longest: int, seconds: float) -> None:
        if not self._per_token_s or seconds <= 0:
            return
        fitted = self._overhead_s + self._per_token_s * rows * longest
        self._eager_ratio += ALPHA * (seconds / fitted - self._eager_ratio)

    def describe(self) -> dict[str, object]:
        return {"chosen": dict(self.chosen), "eager_overhead_ms": round(self._overhead_s * 1000, 3),
                "eager_us_per_token": round(self._per_token_s * 1e6, 4), "eager_ratio": round(self._eager_ratio, 3),
                "graph_ms": {f"{b}x{s}": round(t * 1000, 3) for (b, s), t in sorted(self._graph_s.items())}}
