"""The wire format of `POST /v1/inference`: reading and parsing the body, the request id, vectors.

Kept apart from the handlers so the rules (what is a valid body, what is a valid id) read in one place.
"""

from __future__ import annotations

import binascii
import itertools
import os
import re
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from ..errors import InvalidInput, PayloadTooLarge

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@dataclass(slots=True)
class InferenceCall:
    """A parsed `/v1/inference` body."""

    input: str
    model: str | None
    timeout_ms: int | None
    base64: bool  # `encoding_format: "base64"`: a vector output as base64 of little-endian float32
    body: dict[str, Any]  # the whole body (a generation model reads its sampling fields from it)


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The whole body, at most `limit` bytes. A small body has usually arrived with the headers: then it
    is taken from the buffer at once, without the two awaits of `request.read()`."""
    content = request.content
    if content.is_eof():
        body = content.read_nowait()
    else:
        parts = bytearray(content.read_nowait())
        while not content.is_eof() and len(parts) <= limit:
            parts += await content.readany()
        body = bytes(parts)
    if len(body) > limit:
        raise PayloadTooLarge(f"body exceeds {limit} bytes")
    return body


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also rejects invalid UTF-8 and lone surrogates
        raise InvalidInput(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object")
    return data


def parse_inference_body(body: bytes) -> InferenceCall:
    data = json_object(body)
    value = data.get("input")
    if not isinstance(value, str):
        raise InvalidInput("`input` is required and must be a string")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    fmt = data.get("encoding_format")
    return InferenceCall(value, model, timeout_ms(data), fmt is not None and encoding_format(data) == "base64", data)


def timeout_ms(data: dict[str, Any]) -> int | None:
    """The body's `timeout_ms`: None, or a positive integer."""
    value = data.get("timeout_ms")
    if value is not None and (type(value) is not int or value <= 0):
        raise InvalidInput("`timeout_ms` must be a positive integer")
    return value


def encoding_format(data: dict[str, Any]) -> str:
    """The body's `encoding_format` ("float", the default, or "base64"), as OpenAI's embeddings take it."""
    value = data.get("encoding_format", "float")
    if value not in ("float", "base64"):
        raise InvalidInput('`encoding_format` must be "float" or "base64"')
    return value


def encode_vector(output: Any, *, base64: bool) -> Any:
    """A vector output as JSON takes it: the float32 array itself (orjson writes it without a list of
    Python floats in between), or base64 of its little-endian float32 bytes. Other outputs pass as they are."""
    if base64 and hasattr(output, "astype"):  # a numpy array (numpy itself comes with the backends that need it)
        return binascii.b2a_base64(output.astype("<f4", copy=False).tobytes(), newline=False).decode("ascii")
    return output


class RequestIds:
    """Keeps a client's X-Request-ID when it is sane, otherwise makes a new one, unique per process."""

    def __init__(self) -> None:
        self._prefix = "req_" + os.urandom(4).hex()
        self._counter = itertools.count(1)

    def pick(self, client_value: str | None) -> str:
        if client_value is not None and _REQUEST_ID.fullmatch(client_value):
            return client_value
        return f"{self._prefix}{next(self._counter):x}"
