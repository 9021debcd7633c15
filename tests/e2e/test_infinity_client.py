"""Infinity's own client (`infinity-client`, generated from Infinity's OpenAPI document) against the real
server: `/embeddings`, `/rerank`, `/classify` and `/models` without `/v1`, as Infinity serves them, with
the client's unasked defaults (`model: "default/not-specified"`, `dimensions: 0`, `modality: "text"`);
every answer parsed by the client's own models and checked against the model called directly."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
infinity_client = pytest.importorskip("infinity_client")

from infinity_client.api.default import classify, embeddings, models, rerank  # noqa: E402
from infinity_client.models import (  # noqa: E402
    ClassifyInput,
    ClassifyResult,
    OpenAIEmbeddingInputText,
    OpenAIEmbeddingResult,
    OpenAIModelInfo,
    RerankInput,
    ReRankResult,
)

from inferd.backends.small_models import build_classifier, build_cross_encoder  # noqa: E402
from inferd.backends.transformer import TextModel  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from ..helpers import running_server  # noqa: E402
from .test_classify_routes import config as classifier_config  # noqa: E402
from .test_classify_routes import direct as direct_probabilities  # noqa: E402
from .test_rerank import DOCUMENTS, QUERY, direct_logits, reranker, sigmoid  # noqa: E402

TEXTS = ["how do servers batch requests", "one input per request", "a GPU runs one batch at a time"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {"rr": str(build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))),
            "clf": str(build_classifier(tmp_path_factory.mktemp("classifier")))}


def minilm() -> ModelConfig:
    return ModelConfig(name="minilm", backend="inferd.backends.transformer:create", max_batch_size=8, max_wait_ms=10,
                       options={"max_tokens": 64, "bucket_edges": [16, 64]})


async def test_infinitys_client_embeds_reranks_classifies_and_lists_models(folders):
    reference = TextModel("cpu", {"max_tokens": 64, "bucket_edges": [16, 64]})
    async with running_server(minilm(), reranker(folders["rr"]), classifier_config(folders["clf"])) as srv:
        client = infinity_client.Client(base_url=srv.url, timeout=30.0)
        async with client:
            embedded = await embeddings.asyncio(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS))
            named = await embeddings.asyncio(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS[0], model="minilm"))
            ranked = await rerank.asyncio(client=client, body=RerankInput(query=QUERY, documents=DOCUMENTS, model="rr",
                                                                          return_documents=True))
            top = await rerank.asyncio(client=client, body=RerankInput(query=QUERY, documents=DOCUMENTS, model="rr", top_n=2))
            labelled = await classify.asyncio(client=client, body=ClassifyInput(input_=TEXTS, model="clf"))
            listed = await models.asyncio(client=client)
            refused = await embeddings.asyncio_detailed(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model="none"))
    assert isinstance(embedded, OpenAIEmbeddingResult) and embedded.model == "minilm"  # (no model named: the default)
    assert [item.index for item in embedded.data] == [0, 1, 2]
    for text, item in zip(TEXTS, embedded.data, strict=True):
        want = reference([reference.tokenize(text)])[0]
        assert np.max(np.abs(np.array(item.embedding, dtype=np.float32) - want)) < 1e-4
    assert isinstance(named, OpenAIEmbeddingResult) and len(named.data) == 1 and embedded.usage.total_tokens > 0
    expected = [sigmoid(x) for x in direct_logits(folders["rr"], QUERY, DOCUMENTS, 48)]
    best_first = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert isinstance(ranked, ReRankResult) and [r.index for r in ranked.results] == best_first
    for result in ranked.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-5)
        assert result.document == DOCUMENTS[result.index]  # (a string, as Infinity returns it)
    assert isinstance(top, ReRankResult) and [r.index for r in top.results] == best_first[:2] and top.results[0].document is None
    assert isinstance(labelled, ClassifyResult)
    for probabilities, labels in zip(direct_probabilities(folders["clf"], TEXTS), labelled.data, strict=True):
        # (best first, each score within 1e-5 of transformers' alone: a batch's float32 sums differ in the last bits, and
        # scores rounded to 5 places then compared differed once, 0.61287 against 0.61288)
        want = sorted(probabilities.items(), key=lambda lp: -lp[1])
        assert [x.label for x in labels] == [label for label, _ in want]
        assert [x.score for x in labels] == pytest.approx([p for _, p in want], abs=1e-5)
    assert isinstance(listed, OpenAIModelInfo)
    assert {(m.id, tuple(m.capabilities)) for m in listed.data} == {
        ("minilm", ("embed",)), ("rr", ("rerank",)), ("clf", ("classify",))}
    assert refused.status_code == 404 and b"none" in refused.content


async def test_what_infinity_would_read_differently_is_refused_with_a_reason(http, folders):
    async with running_server(minilm(), classifier_config(folders["clf"])) as srv:
        async def post(path: str, body: dict) -> tuple[int, dict]:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                return resp.status, await resp.json()

        audio = await post("/embeddings", {"input": ["a"], "modality": "audio"})
        raw = await post("/classify", {"input": ["a"], "model": "clf", "raw_scores": True})
        cut = await post("/embeddings", {"input": ["a"], "dimensions": 0})  # (Infinity's client's default: the whole vector)
        tei = await post("/rerank", {"query": "q", "texts": ["a"], "model": "minilm"})  # (TEI's body: TEI's answer shape)
    assert audio[0] == 400 and "modality" in audio[1]["error"]["message"]
    assert raw[0] == 400 and "raw_scores" in raw[1]["message"]
    assert cut[0] == 200 and len(cut[1]["data"][0]["embedding"]) == 384
    assert tei[0] == 400 and "rerank" in tei[1]["message"]  # (minilm embeds: a rerank call names the model's kind)
