"""The wire formats of reranking: Cohere's `POST /v1/rerank` (which Jina's clients also send) and
Text Embeddings Inference's `POST /rerank`, the bodies and the answers. The rules read in one place,
as `embeddings` does for `/v1/embeddings`.

Each (query, document) pair is one input to the batcher: a call with N documents is N inputs, batched
like N requests (by their joint length), and counted N times by rate limits. The model answers each
pair's relevance logit; a score is its sigmoid (between 0 and 1, as Cohere's and TEI's are), or the
logit itself with TEI's `raw_scores`. Results are sorted by score, best first, each with the index of
its document in the call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .inference_body import timeout_ms, without_infinity_defaults
from .json_values import json_object


@dataclass(slots=True)
class RerankBody:
    """A parsed rerank body, in either shape."""

    query: str
    documents: list[str]
    model: str | None
    top_n: int | None  # None: every document
    return_documents: bool
    raw_scores: bool  # the logits rather than their sigmoid (TEI's option)
    truncate: bool | None  # TEI's `truncate`; None: the model's own rule
    timeout_ms: int | None
    infinity: bool = False  # Infinity's body (`documents`) on TEI's `/rerank`: answered in Infinity's shape

    @property
    def count(self) -> int:
        return len(self.documents)

    @property
    def inputs(self) -> list[tuple[str, str]]:
        """One input per document: the pair (query, document)."""
        return [(self.query, document) for document in self.documents]


def parse_rerank_body(body: bytes) -> RerankBody:
    """Cohere's (and Jina's) body: `query`, `documents` (strings, or objects with a `text`), `top_n`,
    `return_documents` (default false, as Cohere's)."""
    return _cohere_call(json_object(body))


def _cohere_call(data: dict[str, Any]) -> RerankBody:
    documents = data.get("documents")
    if not isinstance(documents, list):
        raise InvalidInput("`documents` is required: an array of strings or of objects with a `text`")
    texts = []
    for i, document in enumerate(documents):
        if isinstance(document, dict):
            document = document.get("text")
        if not isinstance(document, str) or not document:
            raise InvalidInput(f"`documents[{i}]` must be a non-empty string or an object with a non-empty `text`")
        texts.append(document)
    top_n = data.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise InvalidInput("`top_n` must be a positive integer")
    return RerankBody(_query(data), _documents(texts), _model(data), top_n,
                      _flag(data, "return_documents", False), False, None, timeout_ms(data))


def parse_tei_rerank_body(body: bytes) -> RerankBody:
    """TEI's body: `query`, `texts`, `raw_scores`, `return_text`, `truncate`; or Infinity's, which posts
    to the same path: `documents` and no `texts` (Cohere's fields, answered as Infinity answers)."""
    data = json_object(body)
    texts = data.get("texts")
    if texts is None and "documents" in data:
        call = _cohere_call(without_infinity_defaults(data))
        call.infinity = True
        return call
    if not isinstance(texts, list) or not all(isinstance(t, str) and t for t in texts):
        raise InvalidInput("`texts` is required: an array of non-empty strings")
    truncate = data.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise InvalidInput("`truncate` must be a boolean")
    return RerankBody(_query(data), _documents(texts), _model(data), None, _flag(data, "return_text", False),
                      _flag(data, "raw_scores", False), truncate, timeout_ms(data))


def _query(data: dict[str, Any]) -> str:
    query = data.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidInput("`query` is required and must be a non-empty string")
    return query


def _documents(texts: list[str]) -> list[str]:
    if not texts:
        raise InvalidInput("at least one document is required")
    return texts


def _model(data: dict[str, Any]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    return model


def _flag(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInput(f"`{name}` must be a boolean")
    return value


def ranked(call: RerankBody, logits: list[float]) -> list[tuple[int, float]]:
    """(document index, score) best first, cut to `top_n`; ties keep the documents' order."""
    scores = logits if call.raw_scores else [_sigmoid(x) for x in logits]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [(i, scores[i]) for i in order[: call.top_n]]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def rerank_payload(call: RerankBody, ranking: list[tuple[int, float]], model: str, request_id: str,
                   tokens: int) -> dict[str, Any]:
    """Cohere's answer (`id`, `results` with `index`, `relevance_score` and, if asked, `document`),
    with Jina's `model` and `usage` beside it."""
    results = []
    for index, score in ranking:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if call.return_documents:
            result["document"] = {"text": call.documents[index]}
        results.append(result)
    return {"id": request_id, "results": results, "model": model, "usage": {"total_tokens": tokens},
            "meta": {"billed_units": {"search_units": 1}}}


def tei_rerank_payload(call: RerankBody, ranking: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """TEI's answer: an array of `{index, score}` (and `text` with `return_text`), best first."""
    if call.return_documents:
        return [{"index": i, "score": score, "text": call.documents[i]} for i, score in ranking]
    return [{"index": i, "score": score} for i, score in ranking]


def infinity_rerank_payload(call: RerankBody, ranking: list[tuple[int, float]], model: str, request_id: str,
                            tokens: int) -> dict[str, Any]:
    """Infinity's answer: `results` of `relevance_score`, `index` and `document` (the text, with
    `return_documents`; else null), best first, with `usage` in OpenAI's shape."""
    results = [{"relevance_score": score, "index": index, "document": call.documents[index] if call.return_documents else None}
               for index, score in ranking]
    return {"object": "rerank", "results": results, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "id": request_id, "created": int(time.time())}
