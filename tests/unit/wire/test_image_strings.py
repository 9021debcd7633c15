"""Lifting base64 images out of a large JSON body before orjson: the same object as orjson's (each lifted
image as its ASCII bytes), or the same error, for every body."""

from __future__ import annotations

import base64
import random

import orjson
import pytest

from inferd.errors import InvalidInput
from inferd.wire import image_strings
from inferd.wire.image_strings import LARGE_BODY, LONG_STRING, json_object_with_images
from inferd.wire.json_values import json_object


def image(n: int, seed: int = 0) -> str:
    return base64.b64encode(random.Random(seed).randbytes(n)).decode()


def lifted(value, at_least: int = LONG_STRING):  # noqa: ANN001, ANN201
    """orjson's `value` with each string of `at_least` characters under an "image" key as its bytes."""
    if type(value) is dict:
        return {k: v.encode() if k == "image" and type(v) is str and len(v) >= at_least else lifted(v, at_least)
                for k, v in value.items()}
    if type(value) is list:
        return [lifted(v, at_least) for v in value]
    return value


def same_as_orjson(body: bytes, lifting: bool = True) -> dict:
    """What `json_object_with_images` makes of `body`: orjson's object, long images as bytes if lifted."""
    got = json_object_with_images(body)
    assert got == (lifted(orjson.loads(body)) if lifting else orjson.loads(body))
    return got


def test_a_large_image_body_is_lifted_and_parses_as_orjson_parses_it(monkeypatch):
    seen = []
    real = image_strings._lift_images
    monkeypatch.setattr(image_strings, "_lift_images", lambda body: seen.append(r := real(body)) or r)
    big = image(300_000)
    got = same_as_orjson(orjson.dumps({"model": "vit", "input": {"image": big}, "timeout_ms": 500}))
    assert got["input"]["image"] == big.encode() and seen[-1] is not None and seen[-1][1] == [big.encode()]
    url = "data:image/png;base64," + image(200_000, 1)
    same_as_orjson(b'{ "input" : { "image" :  "%s" } , "model":"vit"}' % url.encode())
    assert seen[-1][1] == [url.encode()]


def test_an_embeddings_array_of_images_beside_text_and_nesting():
    images = [image(LONG_STRING, seed) for seed in range(5)]
    body = {"model": "vit", "input": [{"image": i} for i in images], "meta": {"x": [1, 2.5, None, True, {"image": "small"}]},
            "text": "a" * (LONG_STRING * 2), "encoding_format": "float", "unicode": "é ✓ 😀"}
    got = same_as_orjson(orjson.dumps(body))
    assert [item["image"] for item in got["input"]] == [i.encode() for i in images]
    assert got["meta"]["x"][-1] == {"image": "small"}  # (short: left to orjson, a str)


def test_small_bodies_and_bodies_with_a_backslash_go_to_orjson_whole(monkeypatch):
    calls = []
    monkeypatch.setattr(image_strings, "_lift_images", lambda body: calls.append(body))
    same_as_orjson(orjson.dumps({"input": {"image": image(1000)}}), lifting=False)
    # an escape anywhere: quotes may not delimit strings, and a "\u0000..." could pose as a placeholder
    same_as_orjson(orjson.dumps({"input": {"image": image(LARGE_BODY)}, "a": "\u00000", "b": 'say "hi"\n'}), lifting=False)
    assert calls == []


@pytest.mark.parametrize("body", [
    b'{"input": {"image": "%s"}' % image(LARGE_BODY).encode(),  # unclosed object
    b'{"input": {"image": "%s}}' % image(LARGE_BODY).encode(),  # unclosed string (odd quotes)
    b'{"input": {"image": "%s"}} trailing' % image(LARGE_BODY).encode(),
    b'{"input": {"image" "%s"}}' % image(LARGE_BODY).encode(),  # no colon: left in, orjson refuses it
    b'["image", "%s"]' % image(LARGE_BODY).encode(),  # not an object
])
def test_broken_bodies_get_orjsons_error(body):
    with pytest.raises(InvalidInput) as ours:
        json_object_with_images(body)
    with pytest.raises(InvalidInput) as plain:
        json_object(body)
    assert str(ours.value) == str(plain.value)


@pytest.mark.parametrize("inside", [b"\t", "é".encode(), b"\xff"])
def test_a_control_character_or_non_ascii_inside_an_image_reaches_the_models_strict_base64_check(inside):
    """The one difference from orjson, on purpose: a raw control character, a non-ASCII character or a
    byte that is not UTF-8 inside a lifted image is not a JSON error for the whole body (orjson's) but
    bad base64, a 400 for that input (the model's)."""
    text = image(LARGE_BODY).encode()
    text = text[:100] + inside + text[100:]
    body = b'{"input": {"image": "%s"}}' % text
    if inside != "é".encode():
        with pytest.raises(InvalidInput):
            json_object(body)
    assert json_object_with_images(body)["input"]["image"] == text
    from inferd.backends.image_headers import b64decode
    with pytest.raises(ValueError):
        b64decode(text)


def test_random_bodies_parse_as_orjson_parses_them():
    rng = random.Random(7)

    def value(depth: int):  # noqa: ANN202
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False, rng.randint(-9, 9), rng.random()])
        if kind == 1:
            return image(rng.choice([10, LONG_STRING, LONG_STRING * 2]), rng.randrange(99))
        if kind == 2:
            return {"image": image(rng.choice([10, LONG_STRING - 3, LONG_STRING * 3]), rng.randrange(99))}
        if kind == 3:
            return "plain text ✓"
        if kind in (4, 5):
            return {rng.choice(["image", "input", "x", "images"]): value(depth + 1) for _ in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    lifts = 0
    for _ in range(60):
        body = {"input": value(0), "more": value(0), "image": value(1)}
        encoded = orjson.dumps(body)
        was_lifted = len(encoded) >= LARGE_BODY and (image_strings._lift_images(encoded) or [None, []])[1] != []
        lifts += was_lifted
        assert json_object_with_images(encoded) == (lifted(body) if was_lifted else body)
    assert lifts > 5  # the lifting path was taken, not only orjson's


def test_a_stretch_of_long_string_bytes_without_a_quote_is_always_found_and_text_bodies_are_not_scanned(monkeypatch):
    """The pre-check before the quote-by-quote scan: whatever its offset, a quote-free stretch of
    LONG_STRING bytes is seen (an aligned block of half that size lies inside it); a body of texts, a
    quote every few hundred bytes, is ruled out without the scan."""
    rng = random.Random(3)
    for _ in range(200):
        start = rng.randrange(0, 3 * LONG_STRING)
        body = b'"' * start + b"A" * LONG_STRING + b'"' * rng.randrange(1, LONG_STRING)
        assert image_strings._may_hold_a_long_string(body)
        shorter = b'"' * start + b"A" * (LONG_STRING // 2 - 1) + b'"' * rng.randrange(1, LONG_STRING)
        assert not image_strings._may_hold_a_long_string(shorter)  # (no block of half the size fits)
    scanned = []
    real = image_strings._lift_images
    monkeypatch.setattr(image_strings, "_lift_images", lambda body: scanned.append(body) or real(body))
    texts = orjson.dumps({"model": "m", "input": [f"a passage about batching servers {i} " * 60 for i in range(100)]})
    assert len(texts) >= LARGE_BODY and same_as_orjson(texts) and not scanned
