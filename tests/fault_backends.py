"""Test-only backends whose faults a test switches on and off (module state, reset by each test)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from inferd.backends import backend_factory
from inferd.backends.sim import SimulatedGPU

hung_once = threading.Event()  # set once a call has hung: later calls run normally
died_once = threading.Event()
failing = threading.Event()  # while set, every call raises
build_failing = threading.Event()  # while set, building a worker raises (a device out of memory)
late_results: list[list[str]] = []  # outputs of calls that returned after hanging


class WorkerKilled(BaseException):
    """Not an Exception: it kills the executor thread rather than failing the batch."""


def reset() -> None:
    hung_once.clear()
    died_once.clear()
    failing.clear()
    build_failing.clear()
    late_results.clear()


@backend_factory
def switchable(device: str, options: Mapping[str, Any]):
    """A simulated GPU; the first batch holding HANG hangs for `hang_s`, the first holding DIE kills the
    worker, and every call fails while `failing` is set; building fails while `build_failing` is set."""
    gpu = SimulatedGPU(latency_ms=float(options.get("latency_ms", 20)), max_batch_size=int(options.get("max_batch_size", 100)),
                       name=device, record_inputs=True)
    if build_failing.is_set():
        raise RuntimeError("CUDA out of memory (simulated)")
    hang_s = float(options.get("hang_s", 3600))
    time.sleep(float(options.get("startup_delay_ms", 0)) / 1000.0)

    def run(inputs: list[str]) -> list[str]:
        if any("HANG" in text for text in inputs) and not hung_once.is_set():
            hung_once.set()
            time.sleep(hang_s)
            outputs = gpu(inputs)
            late_results.append(outputs)
            return outputs
        if any("DIE" in text for text in inputs) and not died_once.is_set():
            died_once.set()
            raise WorkerKilled("the executor thread dies")
        if failing.is_set():
            raise RuntimeError("the device is broken")
        return gpu(inputs)

    run.gpu = gpu  # type: ignore[attr-defined]
    return run
