"""The real PyTorch backend on the CPU: all-MiniLM-L6-v2 through the server, batched by length."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from inferd.backends.transformer import TextModel, default_model_path  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from .conftest import infer, running_server  # noqa: E402

EDGES = [8, 16, 32, 64]


def minilm(**kw) -> ModelConfig:
    options = {"max_tokens": 64, "bucket_edges": EDGES, **kw.pop("options", {})}
    return ModelConfig(name="minilm", backend="inferd.backends.transformer:create", options=options,
                       max_batch_size=kw.pop("max_batch_size", 8), max_wait_ms=kw.pop("max_wait_ms", 30), **kw)


@pytest.fixture(scope="module")
def reference() -> TextModel:
    """The same model called directly, one input at a time."""
    return TextModel("cpu", {"max_tokens": 64, "bucket_edges": EDGES})


def texts() -> list[str]:
    words = "the quick brown fox jumps over a lazy dog while batching servers gather requests".split()
    return [" ".join(words[: 1 + (i * 7) % len(words)] * (1 + i % 4)) for i in range(24)]


async def test_server_embeddings_match_the_model_called_alone(http, reference, caplog):
    inputs = texts()
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        async with running_server(minilm(), access_log_sample_rate=1.0) as srv:
            results = await asyncio.gather(
                *(infer(http, srv.url, {"input": t, "model": "minilm"}, headers={"X-Request-ID": f"e{i}"})
                  for i, t in enumerate(inputs))
            )
            served = srv.models["minilm"]
    for text, (status, body, _) in zip(inputs, results):
        assert status == 200, body
        vector = np.array(body["output"], dtype=np.float32)
        assert vector.shape == (384,)
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-4
        ids, _ = reference.prepare(text)
        alone = reference([ids])[0]
        assert np.max(np.abs(vector - alone)) < 1e-4  # batched and padded with others, the same vector
    assert max(served.batch_sizes) > 1  # they really were batched
    # Every batch holds one length bucket, and no more than max_batch_size inputs.
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    buckets_by_batch = defaultdict(set)
    for line in lines:
        assert line["batch_size"] <= 8
        rid = int(line["request_id"][1:])
        _, bucket = reference.prepare(inputs[rid])
        assert line["bucket"] == bucket
        buckets_by_batch[line["batch_id"]].add(bucket)
    assert len(lines) == len(inputs)
    assert all(len(b) == 1 for b in buckets_by_batch.values())
    assert len({b for s in buckets_by_batch.values() for b in s}) > 1  # inputs spanned several buckets


async def test_warm_up_runs_every_bucket_before_ready(http):
    async with running_server(minilm(), wait_ready=False) as srv:
        async with http.get(f"{srv.url}/readyz") as resp:
            early = resp.status
        status, body, _ = await infer(http, srv.url, {"input": "too soon", "model": "minilm"})
        await srv.wait_ready(60)
        backend = srv.models["minilm"].workers[0].backend
        assert backend.calls == len(EDGES)  # one warm-up batch per bucket, nothing else yet
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200
    if early == 503:  # the model loads in a second or two: the first look normally sees it warming
        assert (status, body["error"]) == (503, "NOT_READY")


async def test_another_local_model_folder_classifies(http, tmp_path):
    """A sequence-classification model from a local folder returns its label, through the same backend."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(tmp_path)
    options = {"model_path": str(tmp_path), "task": "classification"}
    direct = TextModel("cpu", {**options, "max_tokens": 64, "bucket_edges": EDGES})
    async with running_server(minilm(options=options)) as srv:
        inputs = ["a fine day", "this is terrible", "ok"]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"}) for t in inputs))
    for text, (status, body, _) in zip(inputs, results):
        assert status == 200
        expected = direct([direct.prepare(text)[0]])[0]
        assert body["output"]["label"] == expected["label"] in ("negative", "positive")
        assert body["output"]["score"] == pytest.approx(expected["score"], abs=1e-4)
