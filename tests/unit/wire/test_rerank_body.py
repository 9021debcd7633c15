"""The rerank wire formats: Cohere's and TEI's bodies, the ranking and the answers."""

from __future__ import annotations

import math

import orjson
import pytest

from inferd.errors import InvalidInput
from inferd.wire.rerank_body import (
    parse_rerank_body,
    parse_tei_rerank_body,
    ranked,
    rerank_payload,
    tei_rerank_payload,
)


def cohere(**body) -> bytes:
    return orjson.dumps({"query": "q", "documents": ["a", "b"], **body})


def test_cohere_body_takes_strings_or_text_objects_and_its_defaults():
    call = parse_rerank_body(orjson.dumps({"query": "q", "documents": ["a", {"text": "b", "id": 7}], "model": "rr"}))
    assert call.inputs == [("q", "a"), ("q", "b")]
    assert (call.model, call.top_n, call.return_documents, call.raw_scores, call.truncate) == ("rr", None, False, False, None)
    assert parse_rerank_body(cohere(top_n=1, return_documents=True, timeout_ms=50)).return_documents


@pytest.mark.parametrize("body, message", [
    (cohere(documents="a"), "`documents` is required"),
    (cohere(documents=[]), "at least one document"),
    (cohere(documents=["a", ""]), "documents[1]"),
    (cohere(documents=[{"text": 3}]), "documents[0]"),
    (cohere(query=None), "`query`"),
    (cohere(top_n=0), "top_n"),
    (cohere(top_n=True), "top_n"),
    (cohere(return_documents="yes"), "return_documents"),
    (cohere(model=3), "`model`"),
    (cohere(timeout_ms=-1), "timeout_ms"),
    (b"[]", "JSON object"),
])
def test_cohere_body_refuses_with_the_field_named(body, message):
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_rerank_body(body)


def test_tei_body_and_its_options():
    call = parse_tei_rerank_body(orjson.dumps({"query": "q", "texts": ["a"], "raw_scores": True, "return_text": True,
                                               "truncate": False}))
    assert (call.documents, call.raw_scores, call.return_documents, call.truncate) == (["a"], True, True, False)
    for bad in ({"query": "q", "texts": ["a", ""]}, {"query": "q"}, {"query": "q", "texts": ["a"], "truncate": 1}):
        with pytest.raises(InvalidInput):
            parse_tei_rerank_body(orjson.dumps(bad))


def test_ranking_is_best_first_by_sigmoid_cut_to_top_n_and_stable_on_ties():
    call = parse_rerank_body(cohere(documents=["a", "b", "c", "d"], top_n=3))
    ranking = ranked(call, [0.0, 2.0, -1.0, 0.0])
    assert [i for i, _ in ranking] == [1, 0, 3]  # ties keep the documents' order
    assert ranking[0][1] == pytest.approx(1 / (1 + math.exp(-2.0)))
    big = ranked(parse_rerank_body(cohere(top_n=10)), [1000.0, -1000.0])  # no overflow either way
    assert [score for _, score in big] == [1.0, 0.0]
    raw = ranked(parse_tei_rerank_body(orjson.dumps({"query": "q", "texts": ["a", "b"], "raw_scores": True})), [-3.0, 5.0])
    assert raw == [(1, 5.0), (0, -3.0)]


def test_answers_in_each_shape():
    call = parse_rerank_body(cohere(return_documents=True))
    payload = rerank_payload(call, [(1, 0.9), (0, 0.2)], "rr", "req-1", 12)
    assert payload["id"] == "req-1" and payload["model"] == "rr" and payload["usage"] == {"total_tokens": 12}
    assert payload["results"] == [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
                                  {"index": 0, "relevance_score": 0.2, "document": {"text": "a"}}]
    tei = parse_tei_rerank_body(orjson.dumps({"query": "q", "texts": ["a", "b"]}))
    assert tei_rerank_payload(tei, [(1, 0.9)]) == [{"index": 1, "score": 0.9}]
