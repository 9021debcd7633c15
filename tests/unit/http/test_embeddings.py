"""The wire format of OpenAI's /v1/embeddings: the shapes `input` may take, and the answer."""

from __future__ import annotations

import orjson
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
        parse_embeddings_body(body).inputs  # noqa: B018 - (each input is checked as they are read, after their count)


def test_the_answer_keeps_order_and_counts_tokens():
    payload = embeddings_payload("m", ["v0", "v1"], tokens=7, base64=False)
    assert [(d["index"], d["embedding"]) for d in payload["data"]] == [(0, "v0"), (1, "v1")]
    assert payload["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and payload["object"] == "list"


def test_an_embeddings_calls_inputs_are_counted_before_any_is_read():
    """200,000 one-token items in one 1 MB body: their number is a 400 at once (the handler checks
    `count` against the model's cap before `inputs` reads each), not after reading every one."""
    call = parse_embeddings_body(orjson.dumps({"input": [[7]] * 199_999 + [""]}))
    assert call.count == 200_000
    with pytest.raises(InvalidInput, match=r"`input\[199999\]` is an empty string"):
        call.inputs  # noqa: B018 - reading them is what checks them
