"""The benchmarks' stand-in for the GPU (`benchmarks/scenarios/gpu_standin.py`) serves every route they
measure: it replaces only the forward of the real text backend, so a change to the backend's contract
must reach it (a `_compute` without `every_token` once stopped every S9 server at start, and the
benchmark waited five minutes for it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from inferd.config import ModelConfig

from ..helpers import running_server

pytest.importorskip("transformers")
SCENARIOS = Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios"


async def test_the_text_standin_answers_each_route_in_the_backends_shapes_at_the_gpus_time(http, monkeypatch):
    monkeypatch.syspath_prepend(str(SCENARIOS))
    model = ModelConfig(name="minilm", backend="gpu_standin:create", max_batch_size=8, max_wait_ms=5,
                        options={"gpu_ms": 30, "max_tokens": 32, "bucket_edges": [16, 32]})
    async with running_server(model) as srv:
        started = time.monotonic()
        async with http.post(f"{srv.url}/v1/inference", json={"model": "minilm", "input": "E equals 1"}) as resp:
            assert resp.status == 200
            row = (await resp.json())["output"]
        took = time.monotonic() - started
        async with http.post(f"{srv.url}/v1/embeddings", json={"model": "minilm", "input": ["E equals 2", "E"]}) as resp:
            assert resp.status == 200
            vectors = [d["embedding"] for d in (await resp.json())["data"]]
        async with http.post(f"{srv.url}/embed_all", json={"inputs": ["E equals 3", "E"]}) as resp:
            assert resp.status == 200
            tokens = await resp.json()
    assert len(row) == 384 and abs(sum(x * x for x in row) - 1) < 1e-4  # a normalised row of MiniLM's width
    assert took >= 0.03  # (the GPU's time slept: at least one 30 ms call)
    assert [len(v) for v in vectors] == [384, 384]
    assert [len(t) for t in tokens] == [5, 3] and {len(v) for t in tokens for v in t} == {384}  # [CLS] ... [SEP]
