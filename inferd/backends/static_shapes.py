"""Fixed shapes for an encoder's forward: the shape a batch runs at, how it is padded, and CUDA graphs
captured once per shape and replayed.

Why: an eager forward on a GPU is hundreds of small kernel launches, and each launch needs the GIL. With
a busy event loop in the same process, every one of them waits for the loop to let go, and the forward
takes several times as long as it does alone. A CUDA graph replays the whole forward with one call.
Graphs need fixed shapes, so a batch is padded up to the smallest captured shape that holds it: a batch
size from `batch_sizes`, a length from `seq_lens` (the length buckets). Padding rows attend to their
first position only (no row is fully masked, so no NaN) and their outputs are dropped.

`ShapedForward` runs the same padded, fixed-shape path with or without graphs: on the CPU (tests) it
runs eagerly, which checks the padding, masks and shape choice that the GPU path relies on.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

log = logging.getLogger("inferd.backends.static_shapes")

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

Compute = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, 2-D mask) -> (batch, width)


@dataclass(frozen=True)
class ShapeGrid:
    """The shapes a forward may run at: every (batch size, length) pair of the two sorted lists."""

    batch_sizes: tuple[int, ...]
    seq_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.batch_sizes or not self.seq_lens or min(self.batch_sizes) < 1 or min(self.seq_lens) < 1:
            raise ValueError("a shape grid needs positive batch sizes and lengths")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        object.__setattr__(self, "seq_lens", tuple(sorted(set(self.seq_lens))))

    def pick(self, batch: int, longest: int) -> tuple[int, int] | None:
        """The smallest shape holding `batch` rows of up to `longest` tokens, or None (run eagerly)."""
        b = bisect_left(self.batch_sizes, batch)
        s = bisect_left(self.seq_lens, longest)
        if b == len(self.batch_sizes) or s == len(self.seq_lens):
            return None
        return self.batch_sizes[b], self.seq_lens[s]

    def shapes(self) -> list[tuple[int, int]]:
        """Every shape, largest first (captured in this order, later graphs reuse the first ones' memory)."""
        return sorted(((b, s) for b in self.batch_sizes for s in self.seq_lens), key=lambda bs: -bs[0] * bs[1])

    @property
    def max_elements(self) -> int:
        return self.batch_sizes[-1] * self.seq_lens[-1]


def collate(rows: Sequence[np.ndarray], ids: np.ndarray, mask: np.ndarray, pad_id: int) -> None:
    """Write token-id rows into `ids` and `mask` (both (batch, length), batch >= len(rows)), padded.

    Real rows: their ids, then `pad_id` with mask 0. Padding rows (beyond `len(rows)`): `pad_id` with
    mask 1 at position 0 only, so attention over them is defined. Vectorised: one concatenation and
    one masked assignment, whatever the batch size.
    """
    n = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=n)
    filled = np.arange(ids.shape[1]) < lengths[:, None]
    ids[:] = pad_id
    ids[:n][filled] = np.concatenate(rows)
    mask[:n] = filled
    if ids.shape[0] > n:
        mask[n:] = 0
        mask[n:, 0] = 1


@dataclass(slots=True)
class Graph:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # the captured forward's output on the device (kept alive: its memory is the graph's)
    # The device buffer the captured copy from the host writes: every replay writes there, so it lives
    # as long as the graph (freed, the allocator would hand its memory to other tensors).
    static_in: torch.Tensor


class CapturedShapes:
    """What every backend's CUDA graphs share: one graph per fixed shape, captured at warm-up and checked
    against the eager forward, and given up (every batch eager) on any failure, saying why.
    A subclass captures (`_capture_all`, filling `_graphs`) and checks (`_check_against_eager`)."""

    def __init__(self, device: torch.device, graphs: bool, stream: torch.cuda.Stream | None) -> None:
        self.device = device
        self.use_graphs = graphs and device.type == "cuda"
        self.stream = stream
        self.capture_s = 0.0
        self.error: str | None = None  # why graphs were given up at warm-up, if they were
        self._graphs: dict[tuple[int, int], Graph] = {}
        self._done: torch.cuda.Event | None = None  # (made on first use: a CUDA event needs CUDA)

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def captured_shapes(self) -> list[tuple[int, int]]:
        """The captured (batch size, length or image size) shapes, smallest first."""
        return sorted(self._graphs)

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture one graph per shape (CUDA only), then check one against the eager forward; on any
        failure, graphs are off (every batch runs eagerly) and `error` says why. Returns the seconds."""
        if not self.use_graphs:
            return 0.0
        started = time.monotonic()
        try:
            self._capture_all()
            self._check_against_eager()
        except Exception as exc:  # noqa: BLE001 - eager still works: serve without graphs
            log.exception("CUDA graphs disabled: capture or check failed")
            self._graphs.clear()
            self.use_graphs = False
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        torch.cuda.synchronize(self.device)
        self.capture_s = time.monotonic() - started
        log.info("%d CUDA graphs captured on %s in %.1f s", self.graphs, self.device, self.capture_s)
        return self.capture_s

    def warmup_report(self) -> dict[str, Any]:
        """Capture (a no-op on the CPU); what it did, for a backend's `warmup` (`GET /v1/models`)."""
        capture_s = self.capture()
        report: dict[str, Any] = {"cuda_graphs": self.graphs, "graph_capture_s": round(capture_s, 3)}
        if self.error is not None:
            report["graph_error"] = self.error
        return report

    def wait(self) -> None:
        """Until the stream's work is done, with this thread asleep: a blocking event. (A stream's own
        `synchronize()` spins a core for the whole forward, a core the tokeniser or the loop could use.)"""
        done = self._done
        if done is None:
            done = self._done = torch.cuda.Event(blocking=True)
        done.record(self.stream)
        done.synchronize()

    def replay(self, shape: tuple[int, int]) -> None:
        """Queue `shape`'s graph on the stream: the copy in from the host buffers, the forward, the copy out."""
        with torch.cuda.stream(self.stream):
            self._graphs[shape].graph.replay()

    def fill(self, inputs: Sequence[np.ndarray], shape: tuple[int, int]) -> torch.Tensor:
        """Write `inputs`, padded to `shape`, into the host buffers the graphs read; their view."""
        raise NotImplementedError

    def read(self, shape: tuple[int, int], rows: int) -> np.ndarray:
        """A copy of the first `rows` outputs a replay of `shape` left in the host buffers."""
        raise NotImplementedError

    def _capture_all(self) -> None:
        raise NotImplementedError

    def _check_against_eager(self) -> None:
        raise NotImplementedError


class ShapedForward(CapturedShapes):
    """Runs `compute` at fixed shapes, padded into reused host buffers (pinned on CUDA).

    With graphs, each shape's graph holds the whole call: the copy of the ids and mask from the pinned
    host buffers to the device, the forward, and the copy of the outputs back to a pinned host buffer.
    A call is then: fill the host buffers, one replay, one wait. Every call into torch lets go of the GIL
    and has to win it back from a busy event loop; this keeps that to the two calls that cannot be
    avoided. The host buffers stay at one address (each shape views their head), which is what the
    captured copies read and write. Without graphs (the CPU) the same padded call runs eagerly."""

    def __init__(
        self,
        compute: Compute,
        grid: ShapeGrid,
        device: torch.device,
        width: int,
        pad_id: int,
        *,
        graphs: bool,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        super().__init__(device, graphs, stream)
        self.compute = compute
        self.grid = grid
        self.width = width
        self.pad_id = pad_id
        pin = device.type == "cuda"
        # ids and mask in one buffer: rows [0, b) are ids, [b, 2b) the mask, so one copy moves both.
        self._in_host = torch.empty(2 * grid.max_elements, dtype=torch.long, pin_memory=pin)
        self._out_host = torch.empty(grid.batch_sizes[-1] * width, dtype=torch.float32, pin_memory=pin)

    def _host_views(self, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(2b, s) inputs (ids then mask) and (b, width) outputs at the head of the host buffers."""
        return self._in_host[: 2 * b * s].view(2 * b, s), self._out_host[: b * self.width].view(b, self.width)

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for b, s in self.grid.shapes():
            host_in, host_out = self._host_views(b, s)
            host_in[:b].fill_(self.pad_id)
            host_in[b:].fill_(1)
            device_in = torch.empty((2 * b, s), dtype=torch.long, device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up runs (cuBLAS workspaces, autotuning) before capture
                device_in.copy_(host_in, non_blocking=True)
                for _ in range(2):
                    self.compute(device_in[:b], device_in[b:])
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another worker's thread may use its own GPU while this one captures.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                device_in.copy_(host_in, non_blocking=True)
                out = self.compute(device_in[:b], device_in[b:])
                host_out.copy_(out, non_blocking=True)
            self._graphs[(b, s)] = Graph(graph, out, device_in)
            log.debug("captured the graph of shape (%d, %d)", b, s)  # (where a capture that dies got to)

    def _check_against_eager(self) -> None:
        """Replay a graph on real-looking rows (several lengths, padding rows) and compare with eager."""
        b, s = self.grid.batch_sizes[min(2, len(self.grid.batch_sizes) - 1)], self.grid.seq_lens[0]
        rng = np.random.default_rng(0)
        rows = [rng.integers(1, 100, size=int(n), dtype=np.int64) for n in rng.integers(1, s + 1, size=max(1, b - 1))]
        graphed = self.run(rows)
        ids = np.empty((len(rows), max(len(r) for r in rows)), dtype=np.int64)
        mask = np.empty_like(ids)
        collate(rows, ids, mask, self.pad_id)
        eager = self.compute(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device))
        difference = float(np.max(np.abs(graphed - eager.float().cpu().numpy())))
        if not difference <= 1e-2:
            raise RuntimeError(f"a replayed graph differs from the eager forward by {difference:.3g}")

    @torch.inference_mode()
    def timings(self, eager: Compute, repeats: int = 3) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]:
        """(batch size, length, seconds) of each captured graph's replay and of an eager forward (`eager`,
        the model's own path) at the same shape, the fastest of `repeats` each: `PathChoice`'s start."""
        graphs, eagers = [], []
        for (b, s), graph in sorted(self._graphs.items()):
            ids = torch.full((b, s), self.pad_id, dtype=torch.long, device=self.device)
            mask = torch.ones((b, s), dtype=torch.long, device=self.device)
            graphs.append((b, s, self._fastest(repeats, graph.graph.replay)))
            eagers.append((b, s, self._fastest(repeats, partial(eager, ids, mask))))
        return graphs, eagers

    def _fastest(self, repeats: int, call: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            with torch.cuda.stream(self.stream):
                call()
            self.wait()
            best = min(best, time.perf_counter() - started)
        return best

    @torch.inference_mode()
    def run(self, rows: Sequence[np.ndarray], shape: tuple[int, int] | None = None) -> np.ndarray | None:
        """The outputs for `rows` ((len(rows), width) float32, a fresh array) at `shape` (default: the
        smallest that holds them), or None when no shape holds the batch (the caller runs it eagerly)."""
        n = len(rows)
        shape = shape or self.grid.pick(n, max(len(r) for r in rows))
        if shape is None:
            return None
        host_in = self.fill(rows, shape)
        if not self.use_graphs:
            device_in = host_in.to(self.device)
            out = self.compute(device_in[: shape[0]], device_in[shape[0]:])
            return out[:n].to("cpu", torch.float32).numpy().copy()
        self.replay(shape)
        self.wait()  # the one wait; the GIL is free meanwhile
        return self.read(shape, n)

    def fill(self, inputs: Sequence[np.ndarray], shape: tuple[int, int]) -> torch.Tensor:
        b, s = shape
        host_in = self._host_views(b, s)[0]
        both = host_in.numpy()
        collate(inputs, both[:b], both[b:], self.pad_id)
        return host_in

    def read(self, shape: tuple[int, int], rows: int) -> np.ndarray:
        # Copied out: the pinned buffer is the next call's, the outputs live until they are answered.
        return self._host_views(*shape)[1].numpy()[:rows].copy()
