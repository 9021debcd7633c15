"""A text classifier behind vLLM's /v1/classify and TEI's /predict: the small random classifier
`small_models` makes (three labels), each text's probabilities equal to transformers called directly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from inferd.backends.small_models import build_classifier  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from ..helpers import running_server  # noqa: E402

TEXTS = ["a fine day for a walk", "this is terrible", "ok", "the batch was served in time"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
    return str(build_classifier(tmp_path_factory.mktemp("classifier")))


def direct(path: str, texts: list[str]) -> list[dict[str, float]]:
    """Each text's label probabilities from transformers itself, one text at a time."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            probs = torch.softmax(model(**tokenizer(text, return_tensors="pt")).logits[0], dim=-1)
            out.append({model.config.id2label[i]: float(p) for i, p in enumerate(probs)})
    return out


def config(path: str) -> ModelConfig:
    return ModelConfig(name="clf", backend="inferd.backends.transformer:create", max_batch_size=8, max_wait_ms=20,
                       options={"model_path": path, "task": "classification", "max_tokens": 64, "bucket_edges": [16, 64]})


async def test_classify_and_predict_give_transformers_probabilities(http, classifier):
    want = direct(classifier, TEXTS)
    async with running_server(config(classifier)) as srv:
        async with http.post(f"{srv.url}/v1/classify", json={"model": "clf", "input": TEXTS}) as resp:
            assert resp.status == 200, await resp.text()
            vllm_shape = await resp.json()
        async with http.post(f"{srv.url}/predict", json={"inputs": TEXTS[0]}) as resp:
            assert resp.status == 200, await resp.text()
            single = await resp.json()
        async with http.post(f"{srv.url}/predict", json={"inputs": [[t] for t in TEXTS]}) as resp:
            batch = await resp.json()
        async with http.post(f"{srv.url}/v1/inference", json={"model": "clf", "input": TEXTS[1]}) as resp:
            one = (await resp.json())["output"]
    labels = list(want[0])
    assert labels == ["negative", "neutral", "positive"]
    assert [d["index"] for d in vllm_shape["data"]] == [0, 1, 2, 3] and vllm_shape["object"] == "list"
    assert vllm_shape["usage"]["prompt_tokens"] > 0 and vllm_shape["model"] == "clf"
    for item, expected in zip(vllm_shape["data"], want, strict=True):
        assert item["num_classes"] == 3 and item["probs"] == pytest.approx([expected[k] for k in labels], abs=1e-4)
        assert item["label"] == max(expected, key=expected.get)
    for ranked, expected in zip([single, *batch], [want[0], *want], strict=True):
        assert [r["label"] for r in ranked] == sorted(expected, key=expected.get, reverse=True)  # best first
        assert {r["label"]: r["score"] for r in ranked} == pytest.approx(expected, abs=1e-4)
    assert one["label"] == max(want[1], key=want[1].get) and one["scores"] == pytest.approx(want[1], abs=1e-4)


async def test_what_a_classifier_route_cannot_honour_is_a_400_and_other_models_are_refused(http, classifier):
    async with running_server(config(classifier), ModelConfig(name="seed", backend="inferd.backends.sim:create")) as srv:
        answers = {}
        for name, path, body in [
                ("pair", "/predict", {"inputs": ["a premise", "a hypothesis"]}),
                ("batch pair", "/predict", {"inputs": [["a", "b"]]}),
                ("raw", "/predict", {"inputs": "a", "raw_scores": True}),
                ("left", "/predict", {"inputs": "a", "truncation_direction": "Left"}),
                ("empty", "/v1/classify", {"model": "clf", "input": []}),
                ("number", "/v1/classify", {"model": "clf", "input": [3]}),
                ("not a classifier", "/v1/classify", {"model": "seed", "input": "a"})]:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                answers[name] = (resp.status, await resp.json())
    for name, (status, body) in answers.items():
        assert status == 400, (name, body)
    assert "pair" in answers["pair"][1]["message"] and "raw_scores" in answers["raw"][1]["message"]
    assert "error" in answers["empty"][1] and "classifier" in answers["not a classifier"][1]["error"]["message"]
