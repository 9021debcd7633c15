"""A simulated GPU that misbehaves on demand, for tests and demos of the fault paths.

Options (all optional, on top of the sim backend's `latency_ms`, `max_batch_size`, `record_inputs`):
- `fail_marker`: a batch holding an input that contains this string raises (a poison input);
- `fail_probability`: any batch raises with this probability;
- `hang_marker`: a batch holding such an input hangs for `hang_s` (default 3600 s: "forever");
- `hang_probability`: any batch hangs with this probability;
- `wrong_length_marker`: a batch holding such an input returns one output too few;
- `slow_marker` / `slow_ms`: a batch holding such an input takes `slow_ms` longer;
- `startup_delay_ms`: building the worker's model takes this long (warm-up gating);
- `seed`: seeds the probabilities, per device.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

from . import backend_factory
from .sim import SimulatedGPU, sim_options

_FAULT_OPTIONS = frozenset(
    {
        "fail_marker",
        "fail_probability",
        "hang_marker",
        "hang_probability",
        "hang_s",
        "wrong_length_marker",
        "slow_marker",
        "slow_ms",
        "startup_delay_ms",
        "seed",
    }
)


class PoisonInputError(RuntimeError):
    """Raised by the faulty backend for a batch holding a poison input."""


class FaultyGPU(SimulatedGPU):
    """The simulated GPU with the faults its options switch on."""

    def __init__(self, name: str, faults: Mapping[str, Any], **sim: Any) -> None:
        super().__init__(name=name, **sim)
        self.fail_marker: str | None = faults.get("fail_marker")
        self.fail_probability = float(faults.get("fail_probability", 0.0))
        self.hang_marker: str | None = faults.get("hang_marker")
        self.hang_probability = float(faults.get("hang_probability", 0.0))
        self.hang_s = float(faults.get("hang_s", 3600.0))
        self.wrong_length_marker: str | None = faults.get("wrong_length_marker")
        self.slow_marker: str | None = faults.get("slow_marker")
        self.slow_s = float(faults.get("slow_ms", 0.0)) / 1000.0
        self._random = random.Random(f"{faults.get('seed', 0)}:{name}")

    def compute(self, inputs: list[str]) -> list[str]:
        if _holds(inputs, self.hang_marker) or self._chance(self.hang_probability):
            time.sleep(self.hang_s)
        if _holds(inputs, self.slow_marker):
            time.sleep(self.slow_s)
        if _holds(inputs, self.fail_marker) or self._chance(self.fail_probability):
            raise PoisonInputError(f"batch of {len(inputs)} holds a poison input")
        outputs = super().compute(inputs)
        if _holds(inputs, self.wrong_length_marker):
            return outputs[:-1]
        return outputs

    def _chance(self, probability: float) -> bool:
        return probability > 0 and self._random.random() < probability


def _holds(inputs: list[str], marker: str | None) -> bool:
    return marker is not None and any(marker in text for text in inputs)


def check_options(options: Mapping[str, Any]) -> None:
    sim_options(options, "inferd.backends.faulty", extra=_FAULT_OPTIONS)


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> FaultyGPU:
    sim = sim_options(options, "inferd.backends.faulty", extra=_FAULT_OPTIONS)
    faults = {k: v for k, v in options.items() if k in _FAULT_OPTIONS}
    delay_ms = float(faults.get("startup_delay_ms", 0.0))
    if delay_ms:
        time.sleep(delay_ms / 1000.0)
    return FaultyGPU(device, faults, **sim)
