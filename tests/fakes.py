"""Test-only backends, built from the real ones, whose faults and timing a test controls. Their switches
are module state: each test resets what it uses (`reset()`).

- `switchable`: a simulated GPU that hangs, dies or fails on demand;
- `recording`: the real PyTorch backend, noting which threads call its tokenizer;
- `gated`: the real PyTorch backend, built only once a test opens a gate;
- `fake_embedder`: an embedding model on a simulated GPU (controlled latency, remembers what ran);
- `thread_nice`: a simulated GPU whose output says the CPU priority (nice) of the threads that prepared
  and computed it, and of a thread the computing one started (option `execute_nice`: its contract's).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from inferd.backends import Prepared, backend_factory
from inferd.backends.sim import SimulatedGPU

hung_once = threading.Event()  # set once a call has hung: later calls run normally
died_once = threading.Event()
dying = threading.Event()  # while set, every batch holding DIE kills its worker (not only the first)
failing = threading.Event()  # while set, every call raises
build_failing = threading.Event()  # while set, building a worker raises (a device out of memory)
build_gate = threading.Event()  # `gated` builds its model only once this is set
tokenizer_threads: list[str] = []  # the thread of every tokenizer call made by `recording`
late_results: list[list[str]] = []  # outputs of calls that returned after hanging
device_steps: list[tuple[str, int]] = []  # ("launch" or "collect", the batch's token count), by `launching`


class WorkerKilled(BaseException):
    """Not an Exception: it kills the executor thread rather than failing the batch."""


def reset() -> None:
    hung_once.clear()
    died_once.clear()
    dying.clear()
    failing.clear()
    build_failing.clear()
    late_results.clear()
    build_gate.clear()
    tokenizer_threads.clear()
    device_steps.clear()


@backend_factory
def switchable(device: str, options: Mapping[str, Any]):
    """A simulated GPU; the first batch holding HANG hangs for `hang_s`, the first holding DIE kills the
    worker (every one while `dying` is set), and every call fails while `failing` is set; building fails
    while `build_failing` is set."""
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
        if any("DIE" in text for text in inputs) and (dying.is_set() or not died_once.is_set()):
            died_once.set()
            raise WorkerKilled("the executor thread dies")
        if failing.is_set():
            raise RuntimeError("the device is broken")
        return gpu(inputs)

    run.gpu = gpu  # type: ignore[attr-defined]
    return run




class _RecordingTokenizer:
    """Passes everything to the real tokenizer, noting the calling thread of every method call."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            tokenizer_threads.append(threading.current_thread().name)
            return value(*args, **kwargs)

        return call


@backend_factory
def recording(device: str, options: Mapping[str, Any]) -> Any:
    from inferd.backends.transformer import TextModel

    model = TextModel(device, options)
    model.inputs.tokenizer = _RecordingTokenizer(model.inputs.tokenizer)
    return model


@backend_factory
def launching(device: str, options: Mapping[str, Any]) -> Any:
    """The text model with its two steps offered on the CPU (`launch_ahead`), each recorded in order."""
    from inferd.backends.transformer import TextModel

    model = TextModel(device, {**options, "launch_ahead": True})
    launch, collect = model.launch, model.collect

    tokens: dict[int, int] = {}  # id of a launched batch's handle -> its token count

    def recorded_launch(batch: list[Any]) -> Any:
        device_steps.append(("launch", sum(len(ids) for ids in batch)))
        handle = launch(batch)
        tokens[id(handle)] = device_steps[-1][1]
        return handle

    def recorded_collect(launched: Any) -> Any:
        device_steps.append(("collect", tokens.pop(id(launched))))
        return collect(launched)

    model.launch, model.collect = recorded_launch, recorded_collect
    return model


@backend_factory
def gated(device: str, options: Mapping[str, Any]) -> Any:
    from inferd.backends.transformer import TextModel

    if not build_gate.wait(60):
        raise TimeoutError("the test never opened the build gate")
    return TextModel(device, options)


class FakeEmbedder:
    """An embedding model on a simulated GPU: each text's vector is its character codes (4 floats),
    prepared off the loop like a tokenizer would; `latency_ms` per call; remembers what it computed."""

    output_kind = "embedding"

    def __init__(self, latency_ms: float) -> None:
        self.gpu = SimulatedGPU(latency_ms=latency_ms, name="fake-embedder", record_inputs=True)

    def prepare_batch(self, items: list[Any]) -> list[Any]:
        return [Prepared(item if isinstance(item, str) else " ".join(map(str, item)), 0, len(item)) for item in items]

    def __call__(self, batch: list[str]) -> list[Any]:
        import numpy as np

        self.gpu(batch)  # the time, the overlap and size checks, and the record of what ran
        return [np.array([float(ord(c)) for c in (text + "    ")[:4]], dtype=np.float32) for text in batch]


@backend_factory
def fake_embedder(device: str, options: Mapping[str, Any]) -> FakeEmbedder:
    return FakeEmbedder(float(options.get("latency_ms", 20)))


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class ThreadNice:
    """Each output is "<input> prepared at <nice> computed at <nice> started at <nice>": the threads' own
    nice values, the last of a thread the call starts (as PyTorch starts its CPU pool)."""

    def __init__(self, execute_nice: int = 0) -> None:
        self.gpu = SimulatedGPU(latency_ms=2, name="thread-nice")
        self.execute_nice = execute_nice

    def prepare_batch(self, items: list[Any]) -> list[Any]:
        return [Prepared(f"{item} prepared at {_nice()}", 0, 1) for item in items]

    def __call__(self, batch: list[str]) -> list[str]:
        self.gpu(batch)
        started: list[int] = []
        thread = threading.Thread(target=lambda: started.append(_nice()))
        thread.start()
        thread.join()
        return [f"{text} computed at {_nice()} started at {started[0]}" for text in batch]


@backend_factory
def thread_nice(device: str, options: Mapping[str, Any]) -> ThreadNice:
    return ThreadNice(int(options.get("execute_nice", 0)))
