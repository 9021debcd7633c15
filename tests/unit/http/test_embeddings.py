"""The wire format of OpenAI's /v1/embeddings: the shapes `input` may take, and the answer."""

from __future__ import annotations

import pytest

from inferd.errors import InvalidInput
from inferd.http.embeddings import embeddings_payload, parse_embeddings_body


@pytest.mark.parametrize("body, items", [
    (b'{"input": "one"}', ["one"]),
    (b'{"input": ["a", "b"]}', ["a", "b"]),
    (b'{"input": [1, 2, 3]}', [[1, 2, 3]]),
    (b'{"input": [[1, 2], [3]]}', [[1, 2], [3]]),
    (b'{"input": ["a", [7]]}', ["a", [7]]),
])
def test_every_input_shape_becomes_a_list_of_items(body, items):
    assert parse_embeddings_body(body).items == items


@pytest.mark.parametrize("body", [
    b'{"input": []}', b'{"input": ""}', b'{"input": ["a", ""]}', b'{"input": ["a", 3]}', b'{"input": [[1], []]}',
    b'{"input": [[1, true]]}', b'{"input": {"text": "a"}}', b'{}', b'{"input": "a", "dimensions": 64}',
    b'{"input": "a", "encoding_format": "hex"}', b'{"input": "a", "model": 5}',
])
def test_bad_inputs_are_400s(body):
    with pytest.raises(InvalidInput):
        parse_embeddings_body(body)


def test_the_answer_keeps_order_and_counts_tokens():
    payload = embeddings_payload("m", ["v0", "v1"], tokens=7, base64=False)
    assert [(d["index"], d["embedding"]) for d in payload["data"]] == [(0, "v0"), (1, "v1")]
    assert payload["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and payload["object"] == "list"
