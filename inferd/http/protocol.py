"""The wire format of `POST /v1/inference`: reading and parsing the body, the request id, vectors.

Kept apart from the handlers so the rules (what is a valid body, what is a valid id) read in one place.
"""

from __future__ import annotations

import asyncio
import binascii
import itertools
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ..errors import Draining, InferdError, InvalidInput, PayloadTooLarge, RequestTimeout, UnreadableBody
from ..lifecycle import Lifecycle

_BATCH_FIELDS = frozenset({"input", "model", "version", "timeout_ms", "encoding_format"})
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@dataclass(slots=True)
class InferenceCall:
    """A parsed `/v1/inference` body."""

    input: str
    model: str | None
    timeout_ms: int | None
    base64: bool  # `encoding_format: "base64"`: a vector output as base64 of little-endian float32
    body: dict[str, Any]  # the whole body (a generation model reads its sampling fields from it)
    version: str | None = None  # a pinned version (also `model@version`)


class BodyReader:
    """Reads a request's whole body: at most `max_bytes` (413), within `timeout_s` (408).

    A small body has usually arrived with the headers: then it is taken from the buffer at once, without
    the two awaits of `request.read()`. A body still arriving is not owed an answer yet: while it is
    read the request does not count as in flight, so a drain does not wait for a client that stalls
    half-way (if the drain began meanwhile, the request is refused 503 DRAINING once it is in)."""

    def __init__(self, max_bytes: int, timeout_s: float, lifecycle: Lifecycle) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.lifecycle = lifecycle
        self._ahead: dict[int, bytes | InferdError] = {}  # bodies read before their handler, by request

    async def read_ahead(self, request: web.BaseRequest) -> bytes | InferdError:
        """Read a body before its handler does (which then gets it, or the same error, from `read`);
        `forget` it once the handler is done."""
        try:
            body: bytes | InferdError = await self.read(request)
        except InferdError as error:
            body = error
        self._ahead[id(request)] = body
        return body

    def forget(self, request: web.BaseRequest) -> None:
        self._ahead.pop(id(request), None)

    async def read(self, request: web.BaseRequest) -> bytes:
        if self._ahead:
            ahead = self._ahead.get(id(request))
            if isinstance(ahead, InferdError):
                raise ahead
            if ahead is not None:
                return ahead
        content = request.content
        try:
            body = content.read_nowait() if content.is_eof() else await self._read_arriving(content)
        except RequestPayloadError as exc:  # e.g. a body that says gzip and is not
            raise UnreadableBody(f"body could not be read: {' '.join(str(exc).split())}") from None
        if len(body) > self.max_bytes:
            raise PayloadTooLarge(f"body exceeds {self.max_bytes} bytes")
        return body

    async def _read_arriving(self, content: Any) -> bytes:
        lifecycle, limit = self.lifecycle, self.max_bytes
        parts = bytearray(content.read_nowait())
        lifecycle.leave()
        try:
            async with asyncio.timeout(self.timeout_s):
                while not content.is_eof() and len(parts) <= limit:
                    parts += await content.readany()
        except TimeoutError:
            raise RequestTimeout(f"request body not received within {self.timeout_s:g} s") from None
        finally:
            lifecycle.enter()
        if lifecycle.draining:
            raise Draining("server is shutting down; retry on another instance", retry_after_ms=1000)
        return bytes(parts)


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
    if not _BATCH_FIELDS.issuperset(data):
        sampling_fields(data)
    version = data.get("version")
    if version is not None and not isinstance(version, str):
        raise InvalidInput("`version` must be a string")
    return InferenceCall(value, model, timeout_ms(data), fmt is not None and encoding_format(data) == "base64", data,
                         version)


def sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A generation request's sampling fields, each checked here: a bad value is a 400 naming it, never
    an engine error. (Checked on a batch model's request too, where they are ignored: a body is valid or
    not whatever model it goes to.)"""
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    overrides = {}
    for key, (fits, what) in _SAMPLING_FIELDS.items():
        value = body.get(key)
        if value is None:
            continue
        if not fits(value):
            raise InvalidInput(f"`{key}` must be {what}, got {str(value)[:40]}")
        overrides[key] = value
    for key, (fits, what) in _LABELS.items():
        if body.get(key) is not None and not fits(body[key]):
            raise InvalidInput(f"`{key}` must be {what}, got {str(body[key])[:40]}")
    if not isinstance(body.get("stream", False), bool):
        raise InvalidInput("`stream` must be true or false")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and isinstance(options.get("include_usage", False), bool)):
        raise InvalidInput("`stream_options` must be an object like {\"include_usage\": true}")
    return overrides


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SAMPLING_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_tokens": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "temperature": (lambda v: _number(v) and 0 <= v <= 2, "a number from 0 to 2"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number above 0, at most 1"),
    "seed": (_integer, "an integer"),
    "stop": (lambda v: (isinstance(v, str) and v != "") or (
        isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) and s for s in v)),
             "a non-empty string or a list of at most 4 of them"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "frequency_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number from -2 to 2"),
    "presence_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number from -2 to 2"),
    "repetition_penalty": (lambda v: _number(v) and 0 < v <= 2, "a number above 0, at most 2"),
    "top_k": (lambda v: _integer(v) and (v == -1 or v >= 0), "an integer >= 0 (0 or -1: off)"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1"),
}
_LABELS = {"user": (lambda v: isinstance(v, str), "a string")}  # OpenAI's, accepted and not used: checked all the same


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
