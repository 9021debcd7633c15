"""The real embedding path with a stand-in for the GPU, for benchmarks only (S9, the GIL check, images).

`create` builds the real MiniLM backend (tokenizer, length buckets, collation, output rows) and replaces
only its forward: the stand-in sleeps the GPU's time for the batch (sleeping releases the GIL, as a
CUDA forward waiting on the device mostly does) and returns correctly shaped, normalised outputs.
`create_image` does the same for the image backend (decoding, checks, resizing, the batch's pixels
stacked and handed to the forward as on a GPU host).

Options: the backend's (any `task`: a reranker's stand-in answers one score per pair), plus `gpu_ms` (a
fixed time per call) or `gpu_curve` (pairs of
[batch size, ms], interpolated: e.g. the H200's direct MiniLM curve; text only).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from inferd.backends import backend_factory
from inferd.backends.transformer import TextModel
from inferd.backends.vision import ImageModel

# all-MiniLM-L6-v2 fp16 called directly on one H200 (shared/notes/gpu-reality.md): ms per call by batch size
H200_MINILM_CURVE = ((1, 2.9), (32, 3.9), (128, 5.3), (256, 6.6))


def curve_ms(curve: Sequence[Sequence[float]], batch: int) -> float:
    """Linear interpolation of (batch size, ms) points, flat beyond the ends."""
    sizes = [p[0] for p in curve]
    i = bisect_left(sizes, batch)
    if i == 0:
        return float(curve[0][1])
    if i == len(curve):
        return float(curve[-1][1])
    (b0, t0), (b1, t1) = curve[i - 1], curve[i]
    return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)


class StandInModel(TextModel):
    """The real backend with `_compute` (the forward and its head) replaced by the stand-in."""

    def __init__(self, device: str, options: Mapping[str, Any]) -> None:
        options = dict(options)
        fixed_ms = options.pop("gpu_ms", None)
        curve = options.pop("gpu_curve", None) or H200_MINILM_CURVE
        super().__init__(device, options)
        self.gpu_s = (lambda n: float(fixed_ms) / 1000.0) if fixed_ms is not None else (lambda n: curve_ms(curve, n) / 1000.0)
        self.width = self.shaped.width  # (the backend's own output width: 1 for a reranker's score)

    def _compute(self, input_ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor | None = None,
                 every_token: bool = False) -> torch.Tensor:
        """The backend's `_compute` in shape and signature (`every_token`: each row's pooled vector, then a
        vector per token), its values a normalised constant, its time the GPU's."""
        started = time.monotonic()
        rows = input_ids.shape[0]
        shape = (rows, 1 + input_ids.shape[1], self.width) if every_token else (rows, self.width)
        out = torch.full(shape, 1.0 / self.width**0.5)  # a normalised vector per row (and per token)
        time.sleep(max(0.0, self.gpu_s(rows) - (time.monotonic() - started)))
        return out


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> StandInModel:
    torch.set_num_threads(1)
    return StandInModel(device, options)


class StandInImageModel(ImageModel):
    """The real image backend with `_compute` (the forward and its head) replaced by a fixed sleep."""

    def __init__(self, device: str, options: Mapping[str, Any]) -> None:
        options = dict(options)
        self.gpu_s = float(options.pop("gpu_ms", 3.0)) / 1000.0
        super().__init__(device, options)
        self.width = self.shaped.width  # (the backend's own output width)

    def _compute(self, pixels: torch.Tensor) -> torch.Tensor:
        started = time.monotonic()
        out = torch.full((pixels.shape[0], self.width), 1.0 / self.width**0.5)
        time.sleep(max(0.0, self.gpu_s - (time.monotonic() - started)))
        return out


@backend_factory
def create_image(device: str, options: Mapping[str, Any]) -> StandInImageModel:
    torch.set_num_threads(1)
    return StandInImageModel(device, options)
