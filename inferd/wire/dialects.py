"""The routes whose call holds several inputs, each batched like a request of its own: per route, how
its body is read, the kind of outputs its model must give, how its answer is written, and the shape of
its errors. The handler (`inference.InferenceApi`) and the connection's fast path (`fast_path`) run every
one of them the same way from these records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .classify_body import (
    classify_payload,
    infinity_classify_payload,
    parse_classify_body,
    parse_infinity_classify_body,
    parse_tei_predict_body,
    tei_predict_payload,
)
from .embeddings import (
    EmbeddingsBody,
    cohere_embed_payload,
    embeddings_payload,
    parse_cohere_embed_body,
    parse_embeddings_body,
    parse_infinity_embeddings_body,
    parse_tei_embed_all_body,
    parse_tei_embed_body,
    parse_tei_root_embed_body,
    parse_tei_similarity_body,
    similarities,
)
from .rerank_body import (
    RerankBody,
    infinity_rerank_payload,
    parse_rerank_body,
    parse_tei_rerank_body,
    ranked,
    rerank_payload,
    tei_rerank_payload,
)

# A call of several inputs answered: (the parsed call, its outputs in order, the model, the request id, tokens).
Answer = Callable[[Any, list[Any], str, str, int], Any]


@dataclass(frozen=True, slots=True)
class Dialect:
    """A route whose call holds several inputs, each batched like a request of its own: how its body is
    read (`parse`: its `inputs`, `model`, `timeout_ms`), the kind of outputs its model must give, how its
    answer is written from the outputs in the call's order, and whether its errors take OpenAI's shape."""

    parse: Callable[[bytes], Any]
    kind: str
    answer: Answer
    openai: bool = False


def _embeddings_answer(call: EmbeddingsBody, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return embeddings_payload(model, vectors, tokens, call.encodings[0])


def _cohere_embed_answer(call: EmbeddingsBody, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return cohere_embed_payload(call, vectors, request_id, tokens)


def _tei_embed_answer(call: EmbeddingsBody, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return similarities(vectors) if call.similarity else vectors


def _rerank_answer(call: RerankBody, logits: list[float], model: str, request_id: str, tokens: int) -> Any:
    return rerank_payload(call, ranked(call, logits), model, request_id, tokens)


def _tei_rerank_answer(call: RerankBody, logits: list[float], model: str, request_id: str, tokens: int) -> Any:
    if call.infinity:  # (Infinity's body on TEI's path)
        return infinity_rerank_payload(call, ranked(call, logits), model, request_id, tokens)
    return tei_rerank_payload(call, ranked(call, logits))


EMBEDDINGS = Dialect(parse_embeddings_body, "embedding", _embeddings_answer, openai=True)
INFINITY_EMBEDDINGS = Dialect(parse_infinity_embeddings_body, "embedding", _embeddings_answer, openai=True)
TEI_EMBED = Dialect(parse_tei_embed_body, "embedding", _tei_embed_answer)
TEI_SIMILARITY = Dialect(parse_tei_similarity_body, "embedding", _tei_embed_answer)
TEI_EMBED_ALL = Dialect(parse_tei_embed_all_body, "embedding", _tei_embed_answer)  # (each input's tokens' vectors)
TEI_ROOT_EMBED = Dialect(parse_tei_root_embed_body, "embedding", _tei_embed_answer)  # (`/embed`'s or `/similarity`'s)
COHERE_EMBED = Dialect(parse_cohere_embed_body, "embedding", _cohere_embed_answer)
CLASSIFY = Dialect(parse_classify_body, "classification", classify_payload, openai=True)
TEI_PREDICT = Dialect(parse_tei_predict_body, "classification", tei_predict_payload)
INFINITY_CLASSIFY = Dialect(parse_infinity_classify_body, "classification", infinity_classify_payload)
RERANK = Dialect(parse_rerank_body, "rerank", _rerank_answer)
TEI_RERANK = Dialect(parse_tei_rerank_body, "rerank", _tei_rerank_answer)
TEI_ROOT_BY_KIND = {"classification": TEI_PREDICT, "rerank": TEI_RERANK}  # (TEI's `POST /`: else `/embed`'s)
