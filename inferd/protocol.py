"""The wire format of `POST /v1/inference`: parsing the body, and the request id.

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

from .errors import InvalidInput

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@dataclass(slots=True)
class InferenceCall:
    input: str
    model: str | None
    timeout_ms: int | None
    base64: bool = False  # `encoding_format: "base64"`: a vector output as base64 of little-endian float32


def parse_inference_body(body: bytes) -> InferenceCall:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also rejects invalid UTF-8 and lone surrogates
        raise InvalidInput(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object")
    value = data.get("input")
    if not isinstance(value, str):
        raise InvalidInput("`input` is required and must be a string")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    timeout_ms = data.get("timeout_ms")
    if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms <= 0):
        raise InvalidInput("`timeout_ms` must be a positive integer")
    fmt = data.get("encoding_format")
    return InferenceCall(value, model, timeout_ms, fmt is not None and encoding_format(data) == "base64")


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
