"""The Open Inference Protocol's request tensor: JSON data flat or in rows, read in row-major order."""

from __future__ import annotations

import orjson
import pytest

from inferd.errors import InvalidInput
from inferd.wire.open_inference import parse_infer


def texts(shape: list[int], data: object) -> list[str]:
    body = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]})
    return parse_infer(body, None).inputs


@pytest.mark.parametrize("shape, data, expected", [
    ([2, 1], [["first"], ["second"]], ["first", "second"]),
    ([2, 2], [["a", "b"], ["c", "d"]], ["a", "b", "c", "d"]),
    ([2, 2], ["a", "b", "c", "d"], ["a", "b", "c", "d"]),  # flat, whatever the shape
    ([1, 2, 2], [[["a", "b"], ["c", "d"]]], ["a", "b", "c", "d"]),
])
def test_rows_are_read_in_row_major_order(shape, data, expected):
    assert texts(shape, data) == expected


@pytest.mark.parametrize("shape, data", [
    ([3], ["x1", ["x2"], "x3"]),  # nesting the shape does not have
    ([2, 2], [["a", "b", "c"], ["d"]]),  # rows of the wrong length (four elements in all)
    ([2, 1], [["a"], "b"]),
    ([2], [["a"], ["b"]]),
    ([1], [1]),
])
def test_data_nested_unlike_its_shape_is_a_400(shape, data):
    with pytest.raises(InvalidInput):
        texts(shape, data)


@pytest.mark.parametrize("length", ["²", "1" * 5000, "-1", " 2", "99"])
def test_a_header_length_that_is_not_the_json_parts_is_a_400_naming_the_header(length):
    with pytest.raises(InvalidInput, match="Inference-Header-Content-Length"):
        parse_infer(b'{"inputs": []}', length)
