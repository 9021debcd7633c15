"""The wire formats of a classifier's routes: vLLM's /v1/classify and TEI's /predict (TEI's input shapes:
a string or `[string]` is one text, `[[string], ...]` a batch, two strings a pair)."""

from __future__ import annotations

import pytest

from inferd.errors import InvalidInput
from inferd.wire.classify_body import parse_classify_body, parse_tei_predict_body, tei_predict_payload


@pytest.mark.parametrize("body, items, single", [
    (b'{"inputs": "a"}', ["a"], True), (b'{"inputs": ["a"]}', ["a"], True),
    (b'{"inputs": [["a"], ["b"]]}', ["a", "b"], False), (b'{"inputs": [["a"]], "raw_scores": false}', ["a"], False),
])
def test_teis_input_shapes(body, items, single):
    call = parse_tei_predict_body(body)
    assert (call.inputs, call.single) == (items, single)


@pytest.mark.parametrize("body, words", [
    (b'{"inputs": ["premise", "hypothesis"]}', "pair"), (b'{"inputs": [["premise", "hypothesis"]]}', "pair"),
    (b'{"inputs": "a", "raw_scores": true}', "raw_scores"), (b'{"inputs": []}', "inputs"), (b'{"inputs": [["a"], "b"]}', "inputs"),
    (b'{"inputs": "a", "truncation_direction": "Left"}', "truncation_direction"), (b'{"inputs": [[""]]}', "empty"),
])
def test_what_predict_cannot_take_is_a_400_saying_why(body, words):
    with pytest.raises(InvalidInput, match=words):
        parse_tei_predict_body(body).inputs  # noqa: B018


def test_classify_takes_a_string_or_strings_and_refuses_the_rest():
    assert parse_classify_body(b'{"input": "a", "model": "m"}').inputs == ["a"]
    assert parse_classify_body(b'{"input": ["a", "b"]}').inputs == ["a", "b"]
    for body in (b'{"input": []}', b'{"input": 3}', b'{"input": ["a", 3]}', b'{"input": "a", "model": 1}'):
        with pytest.raises(InvalidInput):
            parse_classify_body(body).inputs  # noqa: B018


def test_predict_answers_each_texts_labels_best_first():
    outputs = [{"label": "b", "score": 0.7, "scores": {"a": 0.1, "b": 0.7, "c": 0.2}}]
    call = parse_tei_predict_body(b'{"inputs": "x"}')
    assert tei_predict_payload(call, outputs, "m", "r", 1) == [
        {"score": 0.7, "label": "b"}, {"score": 0.2, "label": "c"}, {"score": 0.1, "label": "a"}]
    batch = parse_tei_predict_body(b'{"inputs": [["x"]]}')
    assert tei_predict_payload(batch, outputs, "m", "r", 1) == [tei_predict_payload(call, outputs, "m", "r", 1)]
