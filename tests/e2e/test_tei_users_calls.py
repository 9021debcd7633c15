"""The ten calls a TEI user makes first, written from TEI's README and API document and made as they show
them (plain HTTP, and Hugging Face's `InferenceClient`, which TEI's docs point to), unchanged, against one
server of an embedding model, a reranker and a classifier (TEI serves one model a process; a call that
names none goes to the first model of its kind). Each answer in TEI's shape and checked against the model
called directly; `docs/coming-from.md` maps the rest."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from inferd.backends.small_models import build_classifier, build_cross_encoder  # noqa: E402
from inferd.backends.transformer import TextModel  # noqa: E402

from ..helpers import running_server  # noqa: E402
from .test_classify_routes import config as classifier_config  # noqa: E402
from .test_classify_routes import direct as direct_probabilities  # noqa: E402
from .test_infinity_client import minilm  # noqa: E402
from .test_rerank import direct_logits, reranker, sigmoid  # noqa: E402

QUESTION = "What is Deep Learning?"
TEXTS = ["Deep Learning is not...", "Deep learning is..."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {"rr": str(build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))),
            "clf": str(build_classifier(tmp_path_factory.mktemp("classifier")))}


async def test_a_tei_users_ten_first_calls_are_answered_as_tei_answers_them(http, folders):
    reference = TextModel("cpu", {"max_tokens": 64, "bucket_edges": [16, 64]})
    vector = lambda text: reference([reference.tokenize(text)])[0]  # noqa: E731
    async with running_server(minilm(), reranker(folders["rr"]), classifier_config(folders["clf"])) as srv:
        async def post(path: str, body: dict) -> tuple[int, object]:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                return resp.status, await resp.json()

        one = await post("/embed", {"inputs": QUESTION})  # 1: the README's first call
        batch = await post("/embed", {"inputs": ["Today is a nice day", "I like you"]})  # 2: a batch of inputs
        cut = await post("/embed", {"inputs": QUESTION, "truncate": True, "normalize": True})  # 3: TEI's own flags
        ranked = await post("/rerank", {"query": QUESTION, "texts": TEXTS})  # 4: re-rankers
        with_text = await post("/rerank", {"query": QUESTION, "texts": TEXTS, "return_text": True})  # 5
        predicted = await post("/predict", {"inputs": "I like you. I love you"})  # 6: sequence classification
        tokens = await post("/tokenize", {"inputs": QUESTION})  # 7
        openai = await post("/v1/embeddings", {"input": QUESTION, "model": "minilm"})  # 8: its OpenAI route
        async with http.get(f"{srv.url}/info") as resp:  # 9
            info = resp.status, await resp.json()
        async with http.get(f"{srv.url}/health") as resp:  # 10, with its metrics
            health = resp.status
        async with http.get(f"{srv.url}/metrics") as resp:
            metrics = await resp.text()
        from huggingface_hub import InferenceClient

        hub = await asyncio.to_thread(InferenceClient(srv.url).feature_extraction, QUESTION)  # (it posts to the root)

    assert one[0] == 200 and len(one[1]) == 1 and np.max(np.abs(np.array(one[1][0]) - vector(QUESTION))) < 1e-4
    assert batch[0] == 200 and [len(row) for row in batch[1]] == [384, 384]
    assert np.max(np.abs(np.array(batch[1][1]) - vector("I like you"))) < 1e-4
    assert cut[0] == 200 and np.max(np.abs(np.array(cut[1][0]) - vector(QUESTION))) < 1e-4
    scores = [sigmoid(x) for x in direct_logits(folders["rr"], QUESTION, TEXTS, 48)]
    assert ranked[0] == 200 and [r["index"] for r in ranked[1]] == sorted(range(2), key=lambda i: -scores[i])  # best first
    assert all(r["score"] == pytest.approx(scores[r["index"]], abs=1e-5) and "text" not in r for r in ranked[1])
    assert with_text[0] == 200 and all(r["text"] == TEXTS[r["index"]] for r in with_text[1])
    probabilities = direct_probabilities(folders["clf"], ["I like you. I love you"])[0]
    assert predicted[0] == 200 and [p["label"] for p in predicted[1]] == sorted(probabilities, key=lambda k: -probabilities[k])
    assert all(p["score"] == pytest.approx(probabilities[p["label"]], abs=1e-5) for p in predicted[1])
    ids = reference.tokenizer.encode(QUESTION).ids
    assert tokens[0] == 200 and [t["id"] for t in tokens[1][0]] == ids
    assert tokens[1][0][0]["special"] is True and {"text", "start", "stop"} <= set(tokens[1][0][1])
    assert openai[0] == 200 and np.max(np.abs(np.array(openai[1]["data"][0]["embedding"]) - vector(QUESTION))) < 1e-4
    assert info[0] == 200 and {"model_id", "model_type", "max_input_length", "max_client_batch_size"} <= set(info[1])
    assert health == 200 and "inferd_requests_total" in metrics
    assert np.asarray(hub).reshape(-1, 384).shape == (1, 384) and np.max(np.abs(np.asarray(hub).reshape(-1) - vector(QUESTION))) < 1e-4
