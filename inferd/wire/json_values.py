"""JSON in and out: a body read as one JSON object (or a client's 400), and bytes written with numpy
arrays serialised directly."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidInput


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also rejects invalid UTF-8 and lone surrogates
        raise InvalidInput(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object")
    return data


def dumps(payload: Any) -> bytes:
    """JSON bytes; numpy arrays (e.g. embeddings) are written directly, without a list of floats in between."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
