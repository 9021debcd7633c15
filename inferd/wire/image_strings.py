"""A large JSON body's base64 images, lifted out before orjson parses the rest.

Why: orjson makes a Python string of every string it parses, on the event loop and holding the GIL.
A 4 MB image sent as JSON base64 (5.5 MB) took it ~10 ms here, against ~1.5 ms for what is below,
and under S16's flood of such bodies `/healthz` waited behind one parse after another. It pays from
~32 KiB: a 224 px PNG's body (197 KiB) 77 against 33 µs, 8% of the loop's CPU per image
(`benchmarks/results/image_standin_lift.md`).

A base64 image needs no JSON unescaping: its alphabet has no quote and no backslash. So in a body
that holds no backslash at all, every quote opens or closes a string, and each long string that is
the value of an `"image"` key is cut out, the rest parsed by orjson, and the value put back as the
bytes it was: `{"image": b"<base64>"}` (an image's base64 as str or as ASCII bytes is one thing to the
code after). Not decoded into a str: that copy and its ASCII check were 0.74 ms of the loop's ~2.7 ms
of Python per 5.5 MB body (py-spy, one client; the bytes slice is a plain copy), and keying the image
for collapsing no longer encodes the str back (1.2 ms). Its content is checked where the model decodes
it, off the loop (strict base64), so a broken one (non-ASCII, a raw control character) is still a 400
for that input, reported as bad base64 rather than as bad JSON. Any other body, or anything unexpected
(an odd number of quotes, too many strings to scan), goes to orjson whole, as every body did before.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from .json_values import json_object

# Measured (orjson against lifting, one image per body): 25 KiB 10.2 / 10.5 µs, 49 KiB 20.0 / 13.4,
# 197 KiB (a 224 px PNG) 77 / 33, 786 KiB 306 / 114.
LARGE_BODY = 32 * 1024  # below this orjson alone is as cheap
LONG_STRING = 16 * 1024  # an image's base64 worth lifting out
MAX_QUOTES = 4096  # a body with more strings than this is not mostly images: orjson reads it
_KEY = b"image"


def json_object_with_images(body: bytes) -> dict[str, Any]:
    """The JSON object `body` holds, as `json_object` parses it (the same errors), cheaper for the loop
    when its bulk is base64 images under `"image"` keys."""
    if len(body) >= LARGE_BODY and b"\\" not in body and _may_hold_a_long_string(body):
        lifted = _lift_images(body)
        if lifted is not None:
            rest, images = lifted
            try:
                return _put_back(json_object(rest), images)
            except InvalidInput:
                pass  # broken: orjson on the whole body says where
    return json_object(body)


def _may_hold_a_long_string(body: bytes) -> bool:
    """Whether some stretch of LONG_STRING bytes may be free of quotes: then one of the aligned blocks of
    half that size is. A block's search for a quote is one memchr that stops at the first: a body of
    texts (a quote every few hundred bytes) is ruled out in ~2 µs for 42 KiB, where finding its quotes
    one by one, or `'"image"' in body`, cost as much as orjson's whole parse (~24 µs)."""
    half = LONG_STRING // 2
    return any(body.find(b'"', at, at + half) < 0 for at in range(0, len(body) - half + 1, half))


def _lift_images(body: bytes) -> tuple[bytes, list[bytes]] | None:
    """`body` with each long `"image"` value replaced by `"\\u0000<n>"` (no string of the body can hold
    a NUL: it has no escapes, and JSON forbids a raw one), and those values' bytes, in order; None:
    nothing to lift, or a body to leave to orjson."""
    quotes: list[int] = []
    at = body.find(b'"')
    while at >= 0:
        if len(quotes) == MAX_QUOTES:
            return None
        quotes.append(at)
        at = body.find(b'"', at + 1)
    if len(quotes) % 2:
        return None  # not JSON: orjson says where
    view = memoryview(body)
    pieces: list[bytes] = []
    images: list[bytes] = []
    kept = 0  # where the body not yet copied to `pieces` starts
    for n in range(2, len(quotes), 2):  # the string between quotes n and n + 1, after the one before it
        start, end = quotes[n] + 1, quotes[n + 1]
        if end - start < LONG_STRING:
            continue
        key_start, key_end = quotes[n - 2] + 1, quotes[n - 1]
        if view[key_start:key_end] != _KEY or body[key_end + 1:start - 1].strip() != b":":
            continue
        images.append(body[start:end])
        pieces += (body[kept:start], b"\\u0000%d" % (len(images) - 1))
        kept = end
    if not images:
        return None
    pieces.append(body[kept:])
    return b"".join(pieces), images


def _put_back(value: Any, images: list[bytes]) -> Any:
    """`value` with each placeholder string replaced by the image it stands for."""
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is str and item[:1] == "\x00":
                value[key] = images[int(item[1:])]
            elif type(item) is dict or type(item) is list:
                _put_back(item, images)
    elif type(value) is list:
        for item in value:
            if type(item) is dict or type(item) is list:
                _put_back(item, images)
    return value
