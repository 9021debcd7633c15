"""Test-only wrappers of the real PyTorch backend: one that records which threads use its tokenizer,
one whose build waits for a gate (module state, reset by each test)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from inferd.backends import backend_factory

build_gate = threading.Event()  # `gated` builds its model only once this is set
tokenizer_threads: list[str] = []  # the thread of every tokenizer call made by `recording`


def reset() -> None:
    build_gate.clear()
    tokenizer_threads.clear()


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
    model.tokenizer = _RecordingTokenizer(model.tokenizer)
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
        from inferd.backends.sim import SimulatedGPU

        self.gpu = SimulatedGPU(latency_ms=latency_ms, name="fake-embedder", record_inputs=True)

    def prepare_batch(self, items: list[Any]) -> list[Any]:
        from inferd.backends import Prepared

        return [Prepared(item if isinstance(item, str) else " ".join(map(str, item)), 0, len(item)) for item in items]

    def __call__(self, batch: list[str]) -> list[Any]:
        import numpy as np

        self.gpu(batch)  # the time, the overlap and size checks, and the record of what ran
        return [np.array([float(ord(c)) for c in (text + "    ")[:4]], dtype=np.float32) for text in batch]


@backend_factory
def fake_embedder(device: str, options: Mapping[str, Any]) -> FakeEmbedder:
    return FakeEmbedder(float(options.get("latency_ms", 20)))
