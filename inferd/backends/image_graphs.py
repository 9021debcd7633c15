"""CUDA graphs of an image model's forward, one per (batch size, image size), captured at warm-up.

Why: as for text (`static_shapes`), an eager forward on a GPU is hundreds of kernel launches that each
need the GIL back from a busy event loop; a graph replays the forward with one call. Images already
come in fixed shapes (a batch holds one of the `image_sizes`), so only the batch size is padded: up to
the smallest captured size that holds it, with zero images whose outputs are dropped (an image model
computes each image apart from the others, so a padding row changes no real row). A batch larger than
every captured size runs eagerly.

`run` does the same padded, fixed-shape call with or without graphs: on the CPU (tests) it runs it
eagerly, which checks the padding and the shape choice the GPU path relies on.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .static_shapes import CapturedShapes, Graph

log = logging.getLogger("inferd.backends.image_graphs")

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)

Compute = Callable[[torch.Tensor], torch.Tensor]  # (batch, s, s, 3) uint8 RGB -> (batch, width) float


class ImageGraphs(CapturedShapes):
    """Runs `compute` at fixed (batch size, image size) shapes, fed from reused host buffers (pinned on
    CUDA). With graphs, each shape's graph holds the copy of the pixels to the device, the forward and
    the copy of the outputs back; a call is: fill the host buffer, one replay, one wait."""

    def __init__(self, compute: Compute, batch_sizes: Sequence[int], image_sizes: Sequence[int], device: torch.device,
                 width: int, *, graphs: bool, stream: torch.cuda.Stream | None = None) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError("graph_batch_sizes must be positive integers")
        super().__init__(device, graphs, stream)
        self.compute = compute
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.image_sizes = tuple(sorted(set(image_sizes)))
        self.width = width
        self._in_host: torch.Tensor | None = None  # (made at the first use: 9.6 MB for 64 images of 224 px)
        self._out_host: torch.Tensor | None = None

    def pick(self, batch: int, size: int) -> tuple[int, int] | None:
        """The smallest captured shape for `batch` images of `size`, or None (run eagerly)."""
        b = bisect_left(self.batch_sizes, batch)
        if b == len(self.batch_sizes) or size not in self.image_sizes:
            return None
        return self.batch_sizes[b], size

    def _host_views(self, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, s, s, 3) pixels and (b, width) outputs at the head of the host buffers (pinned on CUDA;
        one address for good: the captured copies read and write there)."""
        if self._in_host is None or self._out_host is None:
            pin = self.device.type == "cuda"
            largest = self.batch_sizes[-1]
            self._in_host = torch.empty(largest * 3 * self.image_sizes[-1] ** 2, dtype=torch.uint8, pin_memory=pin)
            self._out_host = torch.empty(largest * self.width, dtype=torch.float32, pin_memory=pin)
        return self._in_host[: b * 3 * s * s].view(b, s, s, 3), self._out_host[: b * self.width].view(b, self.width)

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        shapes = sorted(((b, s) for b in self.batch_sizes for s in self.image_sizes), key=lambda bs: -bs[0] * bs[1] ** 2)
        for b, s in shapes:  # largest first: the later graphs reuse the first ones' memory
            host_in, host_out = self._host_views(b, s)
            host_in.zero_()
            device_in = torch.empty((b, s, s, 3), dtype=torch.uint8, device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up runs (cuDNN / cuBLAS choices) before capture
                device_in.copy_(host_in, non_blocking=True)
                for _ in range(2):
                    self.compute(device_in)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another worker's thread may use its own GPU while this one captures.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                device_in.copy_(host_in, non_blocking=True)
                out = self.compute(device_in)
                host_out.copy_(out, non_blocking=True)
            self._graphs[(b, s)] = Graph(graph, out, device_in)
            log.debug("captured the graph of shape (%d, %d)", b, s)  # (where a capture that dies got to)

    def _check_against_eager(self) -> None:
        """Replay a graph on random images (with padding rows) and compare with the eager forward."""
        b, s = self.batch_sizes[min(2, len(self.batch_sizes) - 1)], self.image_sizes[0]
        images = list(np.random.default_rng(0).integers(0, 256, (max(1, b - 1), s, s, 3), dtype=np.uint8))
        graphed = self.run(images)
        eager = self.compute(torch.from_numpy(np.stack(images)).to(self.device)).float().cpu().numpy()
        difference = float(np.max(np.abs(graphed - eager)))
        if not difference <= 1e-2:
            raise RuntimeError(f"a replayed graph differs from the eager forward by {difference:.3g}")

    @torch.inference_mode()
    def run(self, images: Sequence[np.ndarray]) -> np.ndarray | None:
        """The outputs for `images` (each (s, s, 3) uint8, one s) as a fresh (len, width) float32 array,
        or None when no captured shape holds the batch (the caller runs it eagerly)."""
        n = len(images)
        shape = self.pick(n, images[0].shape[0])
        if shape is None:
            return None
        host_in = self.fill(images, shape)
        if not self.use_graphs:
            out = self.compute(host_in.to(self.device))
            return out[:n].to("cpu", torch.float32).numpy().copy()
        self.replay(shape)
        self.wait()  # the one wait; the GIL is free meanwhile
        return self.read(shape, n)

    def fill(self, inputs: Sequence[np.ndarray], shape: tuple[int, int]) -> torch.Tensor:
        host_in = self._host_views(*shape)[0]
        pixels = host_in.numpy()
        np.stack(inputs, out=pixels[: len(inputs)])
        pixels[len(inputs):] = 0
        return host_in

    def read(self, shape: tuple[int, int], rows: int) -> np.ndarray:
        # Copied out: the pinned buffer is the next call's, the outputs live until they are answered.
        return self._host_views(*shape)[1].numpy()[:rows].copy()
