"""A PyTorch batch's forward in two steps, so that the device never waits for the host: `launch` does
the host's part (collation into pinned memory, the copies to the device) and queues the device's work
on the model's stream, returning at once; `collect` waits for it, asleep, and reads the outputs back.
The worker launches the next full batch between the two (`execution.worker`): its host side overlaps
the batch computing. On the CPU both steps run in the launch (there is no queue to run ahead of).

A captured graph reads and writes one set of pinned host buffers (`static_shapes`), so a graph batch
launched behind another graph batch first waits for that one and reads its outputs out of them; an
eager batch has buffers of its own and overlaps either kind. A batch's device time is measured on the
stream (two timing events), not by the host's clock, which would count the wait for the batch ahead
of it: that time is what the graph-or-eager choice (`path_choice`) learns from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .static_shapes import CapturedShapes


@dataclass(slots=True, eq=False)
class Launched:
    """One launched batch: what its collection waits on and reads."""

    rows: int
    longest: int  # its longest input (tokens), for the eager path's timing
    shape: tuple[int, int] | None  # the captured graph it replays, or None: eager
    outputs: Any = None  # host outputs: an array (the CPU; a graph's, once read out) or a tensor filled by `done`
    began: torch.cuda.Event | None = None
    done: torch.cuda.Event | None = None  # (None: on the CPU, done at launch)
    every_token: tuple[int, ...] | None = None  # an eager batch asking some inputs' every token: each row's tokens, 0: pooled


class DeviceSteps:
    """The launches and collections of one model's batches on its device and stream."""

    def __init__(self, shaped: CapturedShapes, device: torch.device, stream: torch.cuda.Stream | None) -> None:
        self.shaped = shaped
        self.on_cuda = device.type == "cuda"
        self.stream = stream
        self._in_graph_buffers: Launched | None = None  # the graph batch whose outputs the host buffers hold

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """`host` on the model's device: pinned and copied without a wait on a GPU (inside an eager
        launch's `forward`, so that the copy is queued on the stream the forward runs on)."""
        return host.pin_memory().to(self.shaped.device, non_blocking=True) if self.on_cuda else host

    def eager(self, rows: int, longest: int, forward: Callable[[], torch.Tensor]) -> Launched:
        """Launch `forward` (collation, copies and the model, queued on the stream; its outputs float32)."""
        if not self.on_cuda:
            return Launched(rows, longest, None, forward().numpy())
        began, done = _timing_events()
        with torch.cuda.stream(self.stream):
            began.record()
            host = forward().to("cpu", non_blocking=True)
            done.record()
        return Launched(rows, longest, None, host, began, done)

    def graph(self, inputs: Sequence[np.ndarray], longest: int, shape: tuple[int, int]) -> Launched:
        """Launch the replay of `shape`'s graph on `inputs` (CUDA only: the CPU has no graphs)."""
        self._read_out_graph()  # (the buffers are about to be this batch's)
        self.shaped.fill(inputs, shape)
        began, done = _timing_events()
        with torch.cuda.stream(self.stream):
            began.record()
            self.shaped.replay(shape)
            done.record()
        launched = self._in_graph_buffers = Launched(len(inputs), longest, shape, None, began, done)
        return launched

    def collect(self, launched: Launched) -> tuple[np.ndarray, float | None]:
        """A launched batch's (rows, width) float32 outputs, once the device is done with it, and its
        seconds on the device (None on the CPU)."""
        if launched.done is None or launched.began is None:
            return launched.outputs, None
        launched.done.synchronize()  # asleep: a blocking event
        if launched.outputs is None:
            self._read_out_graph()
        outputs = launched.outputs
        return (outputs.numpy() if isinstance(outputs, torch.Tensor) else outputs), launched.began.elapsed_time(launched.done) / 1e3

    def _read_out_graph(self) -> None:
        held = self._in_graph_buffers
        if held is not None and held.done is not None and held.shape is not None:
            held.done.synchronize()
            held.outputs = self.shaped.read(held.shape, held.rows)  # (a copy: the buffers are the next batch's)
            self._in_graph_buffers = None


def _timing_events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True, blocking=True), torch.cuda.Event(enable_timing=True, blocking=True)


def launch_ahead(options: Any, device: torch.device) -> bool:
    """Whether a PyTorch backend offers the worker its two steps (option `launch_ahead`; default: on a
    GPU). On the CPU a launch computes the whole batch, so launching one ahead would only hold back the
    answers of the one before it; the option turns it on there for tests of the split."""
    return bool(options.get("launch_ahead", device.type == "cuda"))


__all__ = ["DeviceSteps", "Launched", "launch_ahead"]
