"""The wire format of /v1/inference: what a valid body is, request ids, vectors as JSON or base64."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from inferd.calls.request_ids import RequestIds
from inferd.errors import InvalidInput
from inferd.wire.inference_body import encode_vector, input_kind, parse_image_body, parse_inference_body


def test_a_valid_body_and_its_optional_fields():
    call = parse_inference_body(b'{"input": "hi", "model": "m", "timeout_ms": 250, "encoding_format": "base64"}')
    assert (call.input, call.model, call.timeout_ms, call.base64) == ("hi", "m", 250, True)
    assert call.body["model"] == "m"
    plain = parse_inference_body(b'{"input": ""}')
    assert (plain.model, plain.timeout_ms, plain.base64) == (None, None, False)


@pytest.mark.parametrize("body", [
    b"not json", b"[1, 2]", b'{"input": 3}', b'{}', b'{"input": "x", "model": 1}',
    b'{"input": "x", "timeout_ms": 0}', b'{"input": "x", "timeout_ms": 1.5}', b'{"input": "x", "timeout_ms": true}',
    b'{"input": "x", "encoding_format": "hex"}', b'{"input": "\\ud800"}', b'\xff\xfe',
])
def test_bad_bodies_are_400s(body):
    with pytest.raises(InvalidInput):
        parse_inference_body(body)


def test_request_ids_keep_a_sane_client_value_and_make_unique_ones_otherwise():
    ids = RequestIds()
    assert ids.pick("trace-1.a:b") == "trace-1.a:b"
    made = {ids.pick(None), ids.pick("bad id with spaces"), ids.pick("x" * 129), ids.pick("line\r\nbreak")}
    assert len(made) == 4 and all(i.startswith("req_") for i in made)


def test_vectors_as_float32_arrays_or_base64_and_other_outputs_as_they_are():
    vector = np.array([0.5, -1.25], dtype=np.float32)
    assert encode_vector(vector, base64=False) is vector
    assert np.frombuffer(base64.b64decode(encode_vector(vector, base64=True)), "<f4").tolist() == [0.5, -1.25]
    assert encode_vector({"label": "x"}, base64=True) == {"label": "x"}


def test_an_image_input_comes_as_an_object_or_as_the_whole_body():
    call = parse_inference_body(b'{"input": {"image": "aGk="}, "model": "vit"}')
    assert call.input == {"image": "aGk="} and input_kind(call.input) == "image"
    assert input_kind("text") == "text" and input_kind([1, 2]) == "text" and input_kind(b"\x89PNG") == "image"
    for bad in (b'{"input": {"image": ""}}', b'{"input": {"image": "aGk=", "more": 1}}', b'{"input": {"img": "x"}}'):
        with pytest.raises(InvalidInput, match="image"):
            parse_inference_body(bad)
    raw = parse_image_body(b"\x89PNG...", {"model": "vit", "timeout_ms": "250", "version": "2"})
    assert (raw.input, raw.model, raw.timeout_ms, raw.version) == (b"\x89PNG...", "vit", 250, "2")
    with pytest.raises(InvalidInput, match="timeout_ms"):
        parse_image_body(b"x", {"timeout_ms": "-1"})
    with pytest.raises(InvalidInput, match="empty"):
        parse_image_body(b"", {})
