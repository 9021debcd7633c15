"""The reference simulated GPU: the seed's `batchstring` workload, and a real model's cost curve.

A call takes about `latency_ms` whatever the batch size (the seed's function), accepts
1..`max_batch_size` inputs, and raises if two calls overlap on one simulated device, so a test catches
any worker that runs two batches at once. Each output is a deterministic function of its input
(`expected_output`), so a client can tell that the answer it got belongs to the input it sent.

A variable cost, as a real model's batch costs: `latency_ms + per_item_ms x n + per_token_ms x n x L`
for n inputs whose longest is L tokens (a quarter of its characters, plus one: padded to the longest,
as an encoder is), times 1 + `jitter` x a standard normal draw (at least a tenth of it), so benchmarks
and tests reproduce a real model's curve and noise without one.

Options: `latency_ms` (default 100), `per_item_ms` (0), `per_token_ms` (0), `jitter` (0),
`seed` (the jitter's), `max_batch_size` (default 100), `record_inputs` (default false:
count every input computed, for tests that check what ran), `tag` (put before every output, to tell
versions apart), `memory_mb` (what a device claims to need, for the memory check), `bucket_chars` (e.g. [50]: inputs of up to
50 characters in bucket 0, longer ones in bucket 1, with a rough token count of a quarter of their
characters, as a tokenizer would bucket them; default: one bucket), `prepare_ms` (host-side work per
batch before its device time, default 0) and `pipelined` (default false: the worker calls the device in
two steps, `launch` and `collect`, and prepares the next batch while one computes: a stand-in for a
GPU backend that does).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from typing import Any

from . import backend_factory
from .hooks import Pipelined, PreparesOne


class SimulatedDeviceError(RuntimeError):
    """The simulated GPU was misused: overlapping calls, an empty or oversized batch."""


def expected_output(text: str) -> str:
    """The output the simulated model gives for `text`."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{text}=>{digest}"


class SimulatedGPU:
    """One simulated device. Records each call so tests and benchmarks can see what it ran."""

    def __init__(
        self, latency_ms: float = 100.0, max_batch_size: int = 100, name: str = "sim", record_inputs: bool = False,
        tag: str = "", per_item_ms: float = 0.0, per_token_ms: float = 0.0, jitter: float = 0.0, seed: int | None = None,
    ) -> None:
        self.latency_s = latency_ms / 1000.0
        self.per_item_s = per_item_ms / 1000.0
        self.per_token_s = per_token_ms / 1000.0
        self.jitter = jitter
        self.slowdown = 1.0  # a test may make the device slower (or faster) while it runs
        self._jitter_draws = random.Random(seed)
        self.max_batch_size = max_batch_size
        self.name = name
        self.tag = tag  # put before every output: tells apart what two versions of one model computed
        self.calls: list[tuple[float, float, int]] = []  # (start, end, batch size), time.monotonic()
        self.idle_gaps: list[float] = []  # device idle time between back-to-back calls, seconds
        self.computed: Counter[str] | None = Counter() if record_inputs else None
        self.calls_with_repeats = 0  # (recorded inputs) calls that held one input twice
        self._busy = threading.Lock()
        self._busy_until = 0.0

    def __call__(self, inputs: list[str]) -> list[str]:
        if not inputs:
            raise SimulatedDeviceError("empty batch")
        if len(inputs) > self.max_batch_size:
            raise SimulatedDeviceError(f"batch of {len(inputs)} exceeds the device limit {self.max_batch_size}")
        if not self._busy.acquire(blocking=False):
            raise SimulatedDeviceError(f"overlapping calls on simulated device {self.name}")
        try:
            start = time.monotonic()
            if self._busy_until:
                self.idle_gaps.append(start - self._busy_until)
            self._busy_until = start + self.call_s(inputs)
            outputs = self.compute(inputs)
            remaining = self._busy_until - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
            self.calls.append((start, time.monotonic(), len(inputs)))
            if len(self.calls) > 100_000:  # bounded memory on long runs
                del self.calls[:50_000], self.idle_gaps[:50_000]
            return outputs
        finally:
            self._busy.release()


    def call_s(self, inputs: list[str]) -> float:
        """How long a call on these inputs takes (see the module docstring)."""
        n = len(inputs)
        seconds = self.latency_s + self.per_item_s * n
        if self.per_token_s:
            seconds += self.per_token_s * n * (max(len(text) for text in inputs) // 4 + 1)
        if self.jitter:
            seconds *= max(0.1, 1.0 + self.jitter * self._jitter_draws.gauss(0.0, 1.0))
        return seconds * self.slowdown

    def compute(self, inputs: list[str]) -> list[str]:
        if self.computed is not None:
            self.computed.update(inputs)
            self.calls_with_repeats += len(set(inputs)) < len(inputs)
        tag = self.tag
        return [tag + expected_output(text) for text in inputs] if tag else [expected_output(text) for text in inputs]


class PipelinedGPU(SimulatedGPU, Pipelined):
    """The simulated GPU in two steps: `launch` does `prepare_ms` of host-side work (slept: padding and
    pinned copies mostly run outside the GIL) and queues the batch on the device, where it computes once
    the batch before it is done; `collect` waits for it. With `pipelined`, the worker sees the two steps
    (the contract's `launch` and `collect`); without, only the call that does both. Each batch's time on
    the device is recorded (`calls`) and never overlaps another's; `launches` holds when each launch
    began and ended. An input holding POISON_LAUNCH makes its launch raise."""

    def __init__(self, prepare_ms: float = 0.0, pipelined: bool = True, **sim: Any) -> None:
        super().__init__(**sim)
        self.prepare_s = prepare_ms / 1000.0
        self._device_free_at = 0.0
        self.launches: list[tuple[float, float]] = []
        if not pipelined:  # (the contract reads a hook set to None as absent)
            self.launch = self.collect = None  # type: ignore[assignment]

    def launch(self, inputs: list[str]) -> tuple[list[str], float, float]:
        if not inputs or len(inputs) > self.max_batch_size:
            raise SimulatedDeviceError(f"batch of {len(inputs)} inputs for a device of 1..{self.max_batch_size}")
        began = time.monotonic()
        if any("POISON_LAUNCH" in text for text in inputs):
            raise SimulatedDeviceError("this batch cannot be prepared")
        time.sleep(self.prepare_s)
        start = max(time.monotonic(), self._device_free_at)
        end = self._device_free_at = start + self.call_s(inputs)
        self.launches.append((began, time.monotonic()))
        return list(inputs), start, end

    def collect(self, handle: tuple[list[str], float, float]) -> list[str]:
        inputs, start, end = handle
        remaining = end - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        self.calls.append((start, end, len(inputs)))
        return self.compute(inputs)

    def __call__(self, inputs: list[str]) -> list[str]:
        return PipelinedGPU.collect(self, PipelinedGPU.launch(self, inputs))


class BucketedGPU(SimulatedGPU, PreparesOne):
    """The simulated GPU with inputs in length buckets (`prepare`, run on the way in)."""

    def __init__(self, bucket_chars: list[int], **sim: Any) -> None:
        super().__init__(**sim)
        self.bucket_chars = sorted(bucket_chars)

    def prepare(self, text: str) -> tuple[str, int, int]:
        return text, bisect_left(self.bucket_chars, len(text)), len(text) // 4 + 1


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> SimulatedGPU:
    """One simulated GPU per worker."""
    options = dict(options)
    bucket_chars = options.pop("bucket_chars", None)
    pipelined, prepare_ms = bool(options.pop("pipelined", False)), float(options.pop("prepare_ms", 0.0))
    sim = sim_options(options, "inferd.backends.sim")
    if pipelined or prepare_ms:
        return PipelinedGPU(prepare_ms, pipelined, name=device, **sim)
    return SimulatedGPU(name=device, **sim) if bucket_chars is None else BucketedGPU(list(bucket_chars), name=device, **sim)


def check_options(options: Mapping[str, Any]) -> None:
    sim_options({k: v for k, v in options.items() if k not in ("bucket_chars", "pipelined", "prepare_ms")},
                "inferd.backends.sim")


def memory_bytes(options: Mapping[str, Any]) -> int:
    """What one simulated device claims to need (`memory_mb`, default 0): for the memory check's tests."""
    return int(options.get("memory_mb", 0)) << 20


def sim_options(options: Mapping[str, Any], where: str, extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The simulated device's own options; anything not in `extra` is a typo."""
    known = {"latency_ms", "max_batch_size", "record_inputs", "memory_mb", "tag", "per_item_ms", "per_token_ms", "jitter"}
    unknown = set(options) - known - {"seed"} - extra
    if unknown:
        raise ValueError(f"{where}: unknown options {sorted(unknown)}")
    return {
        "latency_ms": float(options.get("latency_ms", 100.0)),
        "max_batch_size": int(options.get("max_batch_size", 100)),
        "record_inputs": bool(options.get("record_inputs", False)),
        "tag": str(options.get("tag", "")),
        "per_item_ms": float(options.get("per_item_ms", 0.0)),
        "per_token_ms": float(options.get("per_token_ms", 0.0)),
        "jitter": float(options.get("jitter", 0.0)),
        **({"seed": int(options["seed"])} if "seed" in options and "seed" not in extra else {}),
    }


batchstring = SimulatedGPU(name="batchstring")
"""The seed's function as a plain batch function: one shared simulated device, so use it with one worker."""
