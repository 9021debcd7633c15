"""The wire format of the Open Inference Protocol (KServe v2, as Triton speaks it) for batch models:
the infer request and response, with the binary tensor data extension tritonclient uses by default.

A request carries one input tensor, `text` (`image` for an image model), of datatype BYTES and any
shape (usually [N] or [N, 1]); its N elements become N inputs, each batched like a request of its own.
An image model's elements stay bytes (the encoded images, best sent with the binary extension); one
given as a JSON string is taken as base64. The answer's one output tensor,
`output`, is FP32 of shape [N, D] for an embedding model and BYTES of shape [N] otherwise (a structured
output, such as a label and score, as its JSON text). With the binary extension
(`Inference-Header-Content-Length`), tensors travel after the JSON header as raw bytes: BYTES elements
each as a 4-byte little-endian length and the bytes, FP32 as little-endian floats.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .json_values import dumps, json_object

INPUT, IMAGE_INPUT, OUTPUT = "text", "image", "output"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(slots=True)
class InferBody:
    """A parsed infer request."""

    id: str | None
    inputs: list[Any]  # texts; for an image model, the images' bytes (or {"image": base64})
    timeout_ms: int | None  # from the `timeout` parameter (microseconds, as Triton's)
    binary_output: bool


def parse_infer(body: bytes, header_length: str | None, images: bool = False, max_elements: int | None = None) -> InferBody:
    """The infer request; `images`: the model takes images (the input tensor is `image`, its elements
    the images); `max_elements`: more is a 400 before any element is read (262,000 empty ones held the
    loop ~100 ms)."""
    head, blob = _split(body, header_length)
    data = json_object(head)
    call_id = data.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidInput("`id` must be a string")
    parameters = _table(data.get("parameters"), "parameters")
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidInput(f"`inputs` must hold exactly one tensor, `{IMAGE_INPUT if images else INPUT}`")
    values = input_values(_elements(inputs[0], blob, IMAGE_INPUT if images else INPUT, max_elements), images)
    binary = _flag(parameters, "binary_data_output", False)
    outputs = data.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise InvalidInput("`outputs` must be a list of tensors asked for")
        for asked in outputs:
            if asked.get("name") != OUTPUT:
                raise InvalidInput(f"unknown output {asked.get('name')!r}: this model has one, `{OUTPUT}`")
            binary = _flag(_table(asked.get("parameters"), "outputs[].parameters"), "binary_data", binary)
    return InferBody(call_id, values, timeout_parameter_ms(parameters.get("timeout")), binary)


def input_values(elements: list[str | bytes], images: bool) -> list[Any]:
    """The input tensor's elements as the model's inputs: texts (bytes decoded as UTF-8), or for an
    image model the images' bytes (a JSON string: base64)."""
    if images:
        return [e if isinstance(e, bytes) else {"image": e} for e in elements]
    try:
        return [e if isinstance(e, str) else e.decode() for e in elements]
    except UnicodeDecodeError:
        raise InvalidInput(f"`{INPUT}` holds bytes that are not UTF-8 text") from None


def _flag(table: dict[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"`{key}` must be true or false")
    return value


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    # ASCII digits only, and no more of them than the body's own length has: "²" is a digit to
    # str.isdigit() but not to int(), and a 5,000-digit number is not worth converting.
    if not (header_length.isascii() and header_length.isdigit()) or len(header_length) > len(str(len(body))) \
            or int(header_length) > len(body):
        raise InvalidInput(f"{HEADER_LENGTH} must be the length of the JSON part of the body")
    n = int(header_length)
    return body[:n], body[n:]


def _table(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"`{where}` must be an object")
    return value


def _elements(tensor: dict[str, Any], blob: bytes, name: str, max_elements: int | None) -> list[str | bytes]:
    shape: Any = tensor.get("shape")
    count = element_count(tensor.get("name"), tensor.get("datatype"), shape, name, max_elements)
    size = _table(tensor.get("parameters"), "inputs[].parameters").get("binary_data_size")
    if size is not None:
        if type(size) is not int or not 0 <= size <= len(blob):
            raise InvalidInput("`binary_data_size` must be the size of the tensor's bytes after the JSON header")
        elements = unpack_bytes(blob[:size], count)
    else:
        elements = _flat(tensor.get("data"), shape)
        if len(elements) != count:
            raise InvalidInput(f"`{name}` has {len(elements)} elements; its shape {shape} says {count}")
    return elements


def element_count(name: Any, datatype: Any, shape: Any, expected: str, max_elements: int | None) -> int:
    """How many elements the input tensor holds, once its name, datatype and shape are checked (a
    400 before any element is read)."""
    if name != expected:
        raise InvalidInput(f"unknown input {name!r}: this model takes one, `{expected}`")
    if datatype != "BYTES":
        raise InvalidInput(f"`{expected}` must be of datatype BYTES")
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidInput("`shape` must be a list of non-negative integers")
    count = math.prod(shape)
    if count == 0:
        raise InvalidInput(f"`{INPUT}` holds no elements")
    if max_elements is not None and count > max_elements:
        raise InvalidInput(f"the input holds {count} elements; this model takes at most {max_elements}")
    return count


def _flat(data: Any, shape: list[int]) -> list[str | bytes]:
    """The elements of JSON `data` in row-major order (the protocol's): a flat list, or rows nested
    exactly as `shape` says (`[2, 2]`: `[["a", "b"], ["c", "d"]]` is a, b, c, d). Anything between
    the two is a 400, never a guess at an order."""
    if not isinstance(data, list):
        raise InvalidInput(f"`{INPUT}` needs `data` (a list of strings) or binary data")
    if not any(isinstance(value, list) for value in data):
        return [_element(value) for value in data]
    flat: list[str | bytes] = []

    def walk(node: Any, dims: list[int]) -> None:
        if not dims:
            flat.append(_element(node))
        elif not isinstance(node, list) or len(node) != dims[0]:
            raise InvalidInput(f"`{INPUT}` data is nested unlike its shape {shape}: give it flat, or as rows of that shape")
        else:
            for child in node:
                walk(child, dims[1:])

    walk(data, shape)
    return flat


def _element(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"`{INPUT}` elements must be strings")
    return value


def unpack_bytes(raw: bytes, count: int) -> list[str | bytes]:
    elements: list[str | bytes] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise InvalidInput(f"binary `{INPUT}` ends before its {count} elements")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidInput(f"binary `{INPUT}` ends inside an element")
        elements.append(raw[offset:offset + length])
        offset += length
    if offset != len(raw):
        raise InvalidInput(f"binary `{INPUT}` holds more than its {count} elements")
    return elements


def timeout_parameter_ms(value: Any) -> int | None:
    """The `timeout` parameter (Triton's, in microseconds) as a call's timeout in milliseconds."""
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise InvalidInput("the `timeout` parameter must be a positive integer (microseconds)")
    return max(1, math.ceil(value / 1000))


@dataclass(slots=True)
class OutputTensor:
    """The answer's one tensor: FP32 [N, D] (the vectors as one float32 array) or BYTES [N] (texts)."""

    datatype: str
    shape: list[int]
    values: Any  # FP32: the array; BYTES: the texts

    def raw(self) -> bytes:
        """Its bytes as the binary extension and gRPC's `raw_output_contents` carry them."""
        if self.datatype == "FP32":
            return self.values.tobytes()
        return b"".join(struct.pack("<I", len(b)) + b for b in (t.encode() for t in self.values))


def output_tensor(outputs: list[Any]) -> OutputTensor:
    """The outputs in the call's order as the answer's tensor (a structured output as its JSON text)."""
    if outputs and all(isinstance(o, np.ndarray) for o in outputs):
        array = np.stack(outputs).astype("<f4", copy=False)
        return OutputTensor("FP32", list(array.shape), array)
    texts = [o if isinstance(o, str) else dumps(o).decode() for o in outputs]
    return OutputTensor("BYTES", [len(texts)], texts)


def infer_response(model: str, version: str, call_id: str | None, outputs: list[Any], binary: bool) -> tuple[bytes, int | None]:
    """The answer's bytes, and the length of its JSON header when tensors follow it in binary."""
    out = output_tensor(outputs)
    tensor: dict[str, Any] = {"name": OUTPUT, "datatype": out.datatype, "shape": out.shape}
    raw = out.raw() if binary else b""
    if binary:
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = out.values.ravel() if out.datatype == "FP32" else out.values
    head = dumps({"model_name": model, "model_version": version, **({"id": call_id} if call_id is not None else {}),
                  "outputs": [tensor]})
    return (head + raw, len(head)) if binary else (head, None)
