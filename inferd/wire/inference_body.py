"""The body of `POST /v1/inference` and the fields other routes share with it (`timeout_ms`,
`encoding_format`), and how a vector goes back out. The rules of a valid body read in one place."""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .image_strings import json_object_with_images
from .sampling_fields import sampling_fields

_BATCH_FIELDS = frozenset({"input", "model", "version", "timeout_ms", "encoding_format"})


@dataclass(slots=True)
class InferenceBody:
    """A parsed `/v1/inference` body."""

    input: str | dict[str, str | bytes] | bytes  # a text, or for an image model {"image": base64} or the image itself
    model: str | None
    timeout_ms: int | None
    base64: bool  # `encoding_format: "base64"`: a vector output as base64 of little-endian float32
    body: dict[str, Any]  # the whole body (a generation model reads its sampling fields from it)
    version: str | None = None  # a pinned version (also `model@version`)


def parse_inference_body(body: bytes) -> InferenceBody:
    data = json_object_with_images(body)
    value: Any = data.get("input")  # (a JSON value: checked here)
    if not isinstance(value, str) and image_item(value) is None:
        raise InvalidInput('`input` is required and must be a string (or {"image": base64} for an image model)')
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    fmt = data.get("encoding_format")
    if not _BATCH_FIELDS.issuperset(data):
        sampling_fields(data)
    version = data.get("version")
    if version is not None and not isinstance(version, str):
        raise InvalidInput("`version` must be a string")
    return InferenceBody(value, model, timeout_ms(data), fmt is not None and encoding_format(data) == "base64", data,
                         version)


def image_item(value: Any) -> dict[str, str | bytes] | None:
    """`value` if it is an image input, `{"image": "<base64 or data URL>"}` (as Jina's and Infinity's
    APIs send one; the base64 as bytes where `image_strings` lifted it out of a large body), else None.
    Decoded by the model, off the event loop."""
    if type(value) is dict and len(value) == 1:
        image = value.get("image")
        if (type(image) is str or type(image) is bytes) and image:
            return value
    return None


def input_kind(value: Any) -> str:
    """What kind of input a parsed item is: "image" or "text" (token ids are text)."""
    if type(value) is str:
        return "text"
    return "image" if type(value) is bytes or image_item(value) is not None else "text"


def parse_image_body(body: bytes, query: Mapping[str, str]) -> InferenceBody:
    """A `/v1/inference` body that is an image itself (`Content-Type: image/...`); the model, version and
    timeout come in the query string (`?model=vit&timeout_ms=500`)."""
    if not body:
        raise InvalidInput("the body is empty: an image/* body must hold the image")
    timeout = query.get("timeout_ms")
    if timeout is not None and (not timeout.isdigit() or int(timeout) <= 0):
        raise InvalidInput("`timeout_ms` must be a positive integer")
    return InferenceBody(body, query.get("model"), int(timeout) if timeout else None, False, {}, query.get("version"))


INFINITY_ANY_MODEL = "default/not-specified"  # the `model` Infinity's client sends when none is named: the default


def without_infinity_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """An Infinity client's body with what it sends unasked read as Infinity reads it: its `model`
    placeholder as no model named (the default one) and `dimensions: 0` as the whole vector."""
    if data.get("model") == INFINITY_ANY_MODEL:
        del data["model"]
    if data.get("dimensions") == 0:
        del data["dimensions"]
    return data


def timeout_ms(data: dict[str, Any]) -> int | None:
    """The body's `timeout_ms`: None, or a positive integer."""
    value = data.get("timeout_ms")
    if value is not None and (type(value) is not int or value <= 0):
        raise InvalidInput("`timeout_ms` must be a positive integer")
    return value


def encoding_format(data: dict[str, Any], allowed: tuple[str, ...] = ("float", "base64")) -> str:
    """The body's `encoding_format` ("float", the default, or another of `allowed`), as OpenAI's embeddings
    take it (`/v1/embeddings` also takes the compact types: `vector_types`)."""
    value = data.get("encoding_format", "float")
    if value not in allowed:
        raise InvalidInput(f"`encoding_format` must be one of {', '.join(allowed)}")
    return value


def encode_vector(output: Any, *, base64: bool) -> Any:
    """A vector output as JSON takes it: the float32 array itself (orjson writes it without a list of
    Python floats in between), or base64 of its little-endian float32 bytes. Other outputs pass as they are."""
    if base64 and hasattr(output, "astype"):  # a numpy array (numpy itself comes with the backends that need it)
        return binascii.b2a_base64(output.astype("<f4", copy=False).tobytes(), newline=False).decode("ascii")
    return output
