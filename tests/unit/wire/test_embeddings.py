"""The wire format of OpenAI's /v1/embeddings: the shapes `input` may take, and the answer."""

from __future__ import annotations

import orjson
import pytest

from inferd.errors import InvalidInput
from inferd.wire.embeddings import (
    cohere_embed_payload,
    embeddings_payload,
    parse_cohere_embed_body,
    parse_embeddings_body,
    parse_tei_embed_body,
    shaped,
)


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
    b'{"input": [[1, true]]}', b'{"input": {"text": "a"}}', b'{}', b'{"input": "a", "dimensions": 0}',
    b'{"input": "a", "dimensions": "64"}', b'{"input": "a", "dimensions": true}',
    b'{"input": "a", "encoding_format": "hex"}', b'{"input": "a", "model": 5}',
])
def test_bad_inputs_are_400s(body):
    with pytest.raises(InvalidInput):
        parse_embeddings_body(body).inputs  # noqa: B018 - (each input is checked as they are read, after their count)


def test_the_answer_keeps_order_and_counts_tokens():
    payload = embeddings_payload("m", ["v0", "v1"], tokens=7, encoding="float")
    assert [(d["index"], d["embedding"]) for d in payload["data"]] == [(0, "v0"), (1, "v1")]
    assert payload["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and payload["object"] == "list"


def test_an_embeddings_calls_inputs_are_counted_before_any_is_read():
    """200,000 one-token items in one 1 MB body: their number is a 400 at once (the handler checks
    `count` against the model's cap before `inputs` reads each), not after reading every one."""
    call = parse_embeddings_body(orjson.dumps({"input": [[7]] * 199_999 + [""]}))
    assert call.count == 200_000
    with pytest.raises(InvalidInput, match=r"`input\[199999\]` is an empty string"):
        call.inputs  # noqa: B018 - reading them is what checks them


@pytest.mark.parametrize("body", [
    b'{"inputs": []}', b'{"input": "a"}', b'{"inputs": "a", "normalize": "yes"}', b'{"inputs": "a", "truncate": 1}',
    b'{"inputs": "a", "truncation_direction": "Left"}', b'{"inputs": "a", "prompt_name": "query"}',
    b'{"inputs": "a", "dimensions": -1}',
])
def test_bad_tei_embed_bodies_are_400s_naming_the_field(body):
    with pytest.raises(InvalidInput):
        parse_tei_embed_body(body).inputs  # noqa: B018


def test_a_tei_embed_body_is_the_same_call():
    call = parse_tei_embed_body(b'{"inputs": ["a", [7, 8]], "truncate": true, "dimensions": 2}')
    assert (call.items, call.truncate, call.dimensions, call.normalize, call.encodings) == (["a", [7, 8]], True, 2, True, ("float",))
    assert parse_tei_embed_body(b'{"inputs": "a", "normalize": false}').normalize is False
    assert parse_embeddings_body(b'{"input": "a"}').normalize is None  # (OpenAI's: as the model gives them)


def test_vectors_are_cut_and_normalised_again_only_where_the_model_normalises():
    np = pytest.importorskip("numpy")
    unit = np.array([0.6, 0.0, 0.8, 0.0], dtype=np.float32)
    raw = np.array([3.0, 4.0, 12.0], dtype=np.float32)
    cut = shaped([unit], parse_embeddings_body(b'{"input": "a", "dimensions": 1}'), normalized=True)[0]
    assert cut.tolist() == [1.0] and cut.dtype == np.float32 and unit.tolist()[0] == pytest.approx(0.6)  # (a copy)
    plain = parse_embeddings_body(b'{"input": "a"}')
    assert shaped([unit], plain, normalized=True)[0] is unit  # (untouched: nothing asked)
    assert shaped([raw], plain, normalized=False)[0] is raw  # (OpenAI's route gives a model's raw vectors as they are)
    assert shaped([raw], parse_embeddings_body(b'{"input": "a", "dimensions": 2}'), normalized=False)[0].tolist() == [3, 4]
    tei = parse_tei_embed_body(b'{"inputs": "a", "dimensions": 2}')  # (TEI normalises unless told not to)
    assert shaped([raw], tei, normalized=False)[0].tolist() == pytest.approx([0.6, 0.8])
    assert shaped([[3.0, 4.0]], tei, normalized=False)[0] == pytest.approx([0.6, 0.8])  # (a plain list, too)


@pytest.mark.parametrize(("sizes", "dimensions", "refused"), [
    (None, 8, "its vectors come at their own size"), (384, 385, "it takes up to 384"), (384, 384, None),
    ((64, 128), 100, "it takes 64, 128"), ((64, 128), 64, None),
])
def test_dimensions_a_model_does_not_take_are_refused_naming_what_it_takes(sizes, dimensions, refused):
    from types import SimpleNamespace

    from inferd.backends.contract import Capabilities
    from inferd.http.inference import _refuse_vectors_it_cannot_give

    model = SimpleNamespace(name="m", offers=Capabilities(embedding_sizes=sizes, normalized=True),
                            config=SimpleNamespace(options={}))
    call = parse_embeddings_body(orjson.dumps({"input": "a", "dimensions": dimensions}))
    if refused is None:
        _refuse_vectors_it_cannot_give(call, model)
    else:
        with pytest.raises(InvalidInput, match=refused):
            _refuse_vectors_it_cannot_give(call, model)


def test_cohere_embed_body_maps_to_the_same_call():
    call = parse_cohere_embed_body(b'{"texts": ["a", "b"], "input_type": "search_query", "embedding_types": '
                                   b'["int8", "float", "int8"], "output_dimension": 64, "truncate": "NONE"}')
    assert call.items == ["a", "b"] and call.encodings == ("int8", "float") and call.dimensions == 64
    assert call.truncate is False  # (as TEI's truncate: false: refused by a model that truncates)
    default = parse_cohere_embed_body(b'{"texts": ["a"]}')
    assert default.encodings == ("float",) and default.truncate is None and default.dimensions is None


@pytest.mark.parametrize("body, field", [
    (b'{"texts": []}', "texts"), (b'{"texts": "a"}', "texts"), (b'{"texts": ["a", 1]}', "texts"), (b'{}', "texts"),
    (b'{"texts": ["a"], "embedding_types": ["int4"]}', "embedding_types"),
    (b'{"texts": ["a"], "embedding_types": []}', "embedding_types"),
    (b'{"texts": ["a"], "input_type": "image"}', "input_type"),
    (b'{"texts": ["a"], "truncate": "START"}', "truncate"), (b'{"texts": ["a"], "truncate": "LEFT"}', "truncate"),
    (b'{"texts": ["a"], "output_dimension": 0}', "output_dimension"),
    (b'{"texts": ["a"], "images": ["data:image/png;base64,AA=="]}', "images"),
])
def test_cohere_embed_bad_bodies_are_400s_naming_the_field(body, field):
    with pytest.raises(InvalidInput, match=f"`{field}"):
        parse_cohere_embed_body(body).inputs  # noqa: B018


def test_cohere_embed_answer_gives_each_type_under_its_name():
    np = pytest.importorskip("numpy")
    call = parse_cohere_embed_body(b'{"texts": ["x"], "embedding_types": ["float", "ubinary"]}')
    payload = orjson.loads(orjson.dumps(cohere_embed_payload(call, [np.array([0.5, -0.5], dtype=np.float32)], "rid", 3),
                                        option=orjson.OPT_SERIALIZE_NUMPY))
    assert payload == {"id": "rid", "embeddings": {"float": [[0.5, -0.5]], "ubinary": [[128]]}, "texts": ["x"],
                       "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 3}},
                       "response_type": "embeddings_by_type"}


def test_encoding_format_takes_the_compact_types():
    assert parse_embeddings_body(b'{"input": "a", "encoding_format": "binary"}').encodings == ("binary",)
    assert parse_embeddings_body(b'{"input": "a"}').encodings == ("float",)
