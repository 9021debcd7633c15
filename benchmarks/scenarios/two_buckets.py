"""A benchmark-only backend: the seed's simulated GPU with inputs over 50 characters in a second length
bucket (as a tokenizer would bucket them), for S10. Works with earlier inferd checkouts too (their
`prepare` took (input, bucket))."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferd.backends import backend_factory
from inferd.backends.sim import SimulatedGPU, sim_options


class TwoBucketGPU(SimulatedGPU):
    def prepare(self, text: str) -> tuple[str, int]:
        return text, int(len(text) > 50)


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> TwoBucketGPU:
    return TwoBucketGPU(name=device, **sim_options(options, "two_buckets"))
