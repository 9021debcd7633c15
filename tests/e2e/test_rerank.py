"""Reranking through the real server: a cross-encoder (random weights, made on the spot, MiniLM's
tokenizer) behind Cohere's `POST /v1/rerank` and TEI's `POST /rerank`, each (query, document) pair a
batched input, scores checked against the model called directly with transformers' own tokenizer."""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from inferd.backends.small_models import build_cross_encoder  # noqa: E402
from inferd.config import AuthConfig, ModelConfig, TenantConfig, TierConfig  # noqa: E402

from ..helpers import infer, running_server, sim_model  # noqa: E402

QUERY = "how do servers batch requests"
DOCUMENTS = [
    "a dynamic batching server gathers concurrent requests into one call",
    "soup",
    "the weather was cold and the train was late " * 6,
    "GPUs run one batch at a time",
    "batching",
]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> str:
    """A BERT cross-encoder with one relevance output (`small_models`: weights spread wide so the scores
    differ clearly)."""
    return str(build_cross_encoder(tmp_path_factory.mktemp("cross-encoder")))


def direct_logits(path: str, query: str, documents: list[str], max_tokens: int) -> list[float]:
    """The model called as sentence-transformers' CrossEncoder calls it: the pair tokenised together,
    truncated longest-first, one padded batch."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    encoded = tokenizer([query] * len(documents), documents, padding=True, truncation=True, max_length=max_tokens,
                        return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits[:, 0].tolist()


def reranker(path: str, **options) -> ModelConfig:
    return ModelConfig(name="rr", backend="inferd.backends.transformer:create", max_batch_size=4, max_wait_ms=20,
                       options={"model_path": path, "task": "rerank", "max_tokens": 48, "bucket_edges": [16, 32],
                                **options})


async def post(http, url: str, path: str, body, **kw):
    async with http.post(f"{url}{path}", json=body, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


async def test_cohere_and_tei_rerank_score_every_pair_as_the_model_called_directly(http, cross_encoder):
    expected = [sigmoid(x) for x in direct_logits(cross_encoder, QUERY, DOCUMENTS, 48)]
    best_first = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert len({round(s, 4) for s in expected}) == len(DOCUMENTS)  # (distinct enough for the order to be checked)
    async with running_server(reranker(cross_encoder)) as srv:
        # Several calls at once: their pairs share batches (max 4 pairs a batch, 5 pairs a call).
        cohere = [{"model": "rr", "query": QUERY, "documents": DOCUMENTS, "return_documents": True},
                  {"model": "rr", "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "top_n": 2},
                  {"query": QUERY, "documents": DOCUMENTS[::-1]}]
        answers = await asyncio.gather(*(post(http, srv.url, "/v1/rerank", body) for body in cohere),
                                       post(http, srv.url, "/rerank", {"query": QUERY, "texts": DOCUMENTS}),
                                       post(http, srv.url, "/rerank", {"query": QUERY, "texts": DOCUMENTS,
                                                                       "raw_scores": True, "return_text": True}))
        served = srv.models["rr"]
        async with http.get(f"{srv.url}/v1/models") as resp:
            listing = await resp.json()
    (s1, full), (s2, top), (s3, reversed_), (s4, tei), (s5, tei_raw) = answers
    assert (s1, s2, s3, s4, s5) == (200,) * 5, answers
    assert [r["index"] for r in full["results"]] == best_first
    for result in full["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    assert full["model"] == "rr" and full["usage"]["total_tokens"] > len(DOCUMENTS) and full["id"]
    assert [r["index"] for r in top["results"]] == best_first[:2] and "document" not in top["results"][0]
    n = len(DOCUMENTS)  # the reversed call names the same documents by their new places
    assert [n - 1 - r["index"] for r in reversed_["results"]] == best_first
    assert [r["index"] for r in tei] == best_first and set(tei[0]) == {"index", "score"}
    logits = direct_logits(cross_encoder, QUERY, DOCUMENTS, 48)
    for result in tei_raw:
        assert result["score"] == pytest.approx(logits[result["index"]], abs=1e-5)
        assert result["text"] == DOCUMENTS[result["index"]]
    # Every pair an input of its own: computed, or answered by the computation of the same pair sent by
    # another call at the same time (collapsing is on by default).
    assert served.stats.requests_computed + served.shared.collapsed == 5 * n and served.stats.requests_computed >= n
    assert max(served.stats.batch_sizes) > 1  # batched together
    entry = next(m for m in listing["data"] if m["id"] == "rr")
    assert entry["inputs"] == "pair" and entry["output_kind"] == "rerank"


async def test_a_pair_over_the_token_limit_is_truncated_or_refused_as_configured(http, cross_encoder):
    long_document = "word " * 200
    async with running_server(reranker(cross_encoder)) as srv:
        status, body = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": ["short", long_document]})
        assert status == 200
        scores = {r["index"]: r["relevance_score"] for r in body["results"]}
        expected = [sigmoid(x) for x in direct_logits(cross_encoder, QUERY, ["short", long_document], 48)]
        assert scores[1] == pytest.approx(expected[1], abs=1e-5)  # cut to 48 tokens, as transformers cuts it
        status, body = await post(http, srv.url, "/rerank", {"query": QUERY, "texts": ["a"], "truncate": False})
        assert status == 400 and "truncate" in body["message"]
    async with running_server(reranker(cross_encoder, truncate=False)) as srv:
        status, body = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": ["short", long_document]})
        assert status == 400 and body["error"] == "INVALID_INPUT" and "48 tokens" in body["message"]
        status, body = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": ["short"]})
        assert status == 200  # the model still serves what fits


async def test_bad_rerank_calls_get_clear_errors(http, cross_encoder):
    async with running_server(reranker(cross_encoder), sim_model("m")) as srv:
        cases = [
            ("/v1/rerank", {"query": QUERY}, "`documents` is required"),
            ("/v1/rerank", {"query": "", "documents": ["a"]}, "`query`"),
            ("/v1/rerank", {"query": QUERY, "documents": []}, "at least one document"),
            ("/v1/rerank", {"query": QUERY, "documents": [{"title": "no text"}]}, "documents[0]"),
            ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
            ("/v1/rerank", {"model": "m", "query": QUERY, "documents": ["a"]}, "not a reranker"),
            ("/rerank", {"query": QUERY, "texts": ["a", 3]}, "`texts`"),
        ]
        for path, body, message in cases:
            status, answer = await post(http, srv.url, path, body)
            assert status == 400 and message in answer["message"], (body, answer)
        status, answer = await post(http, srv.url, "/v1/rerank", {"model": "nope", "query": QUERY, "documents": ["a"]})
        assert status == 404 and answer["error"] == "MODEL_NOT_FOUND"
        status, answer = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": ["x" * 100_000]})
        assert status == 400 and "characters" in answer["message"]  # a pair counts against max_input_chars
        status, answer, _ = await infer(http, srv.url, {"model": "rr", "input": "a lone text"})
        assert status == 400 and "takes pair inputs, not text" in answer["message"]


async def test_rate_limits_count_every_pair(http, cross_encoder):
    key = "key-of-tenant-t"
    limited = dict(auth=AuthConfig(enabled=True), tiers=(TierConfig("free", rate_per_s=0.01, burst=5),),
                   tenants=(TenantConfig("t", "free", hashlib.sha256(key.encode()).hexdigest()),))
    headers = {"Authorization": f"Bearer {key}"}
    async with running_server(reranker(cross_encoder), **limited) as srv:
        status, _ = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS[:3]}, headers=headers)
        assert status == 200  # 3 of the 5
        status, body = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS[:3]},
                                  headers=headers)
        assert status == 429 and body["error"] == "RATE_LIMITED" and body["retry_after_ms"] > 0
        status, _ = await post(http, srv.url, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:2]}, headers=headers)
        assert status == 200  # the 2 left


async def test_calls_naming_no_model_go_to_the_first_model_of_their_kind(http, cross_encoder):
    """TEI's `/rerank` body has no `model`: with a text model configured first, the reranker answers."""
    async with running_server(sim_model("m"), reranker(cross_encoder)) as srv:
        status, tei = await post(http, srv.url, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:2]})
        assert status == 200 and sorted(r["index"] for r in tei) == [0, 1], tei
        status, cohere = await post(http, srv.url, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS[:2]})
        assert status == 200 and cohere["model"] == "rr"
        status, answer, _ = await infer(http, srv.url, {"input": "still the default's"})  # (/v1/inference: the default)
        assert status == 200, answer


async def test_a_short_call_beside_large_ones_is_scored_right_and_batches_are_kept_short_for_it(http, cross_encoder):
    """A one-document call among five-document calls (a quarter of a 4-pair batch or fewer is short),
    every pair distinct (identical pairs would share one computation): the model says short calls now
    come beside large ones (its batches stop at the smallest size with 95% of the best throughput), and
    every pair still gets its own score."""
    calls = [{"query": QUERY, "documents": [f"{d} ({n})" for d in DOCUMENTS]} for n in range(3)]
    calls.append({"query": QUERY, "documents": ["a short call of its own"]})
    documents = [d for body in calls for d in body["documents"]]
    expected = dict(zip(documents, (sigmoid(x) for x in direct_logits(cross_encoder, QUERY, documents, 48)), strict=True))
    async with running_server(reranker(cross_encoder)) as srv:
        async with http.get(f"{srv.url}/v1/models/rr") as resp:
            before = (await resp.json())["cost_model"]["short_calls_beside_large"]
        answers = await asyncio.gather(*(post(http, srv.url, "/v1/rerank", body) for body in calls))
        async with http.get(f"{srv.url}/v1/models/rr") as resp:
            after = (await resp.json())["cost_model"]["short_calls_beside_large"]
    assert (before, after) == (False, True)
    for (status, answer), body in zip(answers, calls, strict=True):
        assert status == 200, answer
        assert sorted(r["index"] for r in answer["results"]) == list(range(len(body["documents"])))
        for result in answer["results"]:
            assert result["relevance_score"] == pytest.approx(expected[body["documents"][result["index"]]], abs=1e-5)
