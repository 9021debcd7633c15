"""Compact vector types: int8 and uint8 scaled by each vector's own largest magnitude, binary and
ubinary one bit a component packed high bit first."""

from __future__ import annotations

import base64

import pytest

from inferd.wire.vector_types import encoded

np = pytest.importorskip("numpy")


def test_int8_scales_each_vector_by_its_own_largest_magnitude():
    vector = np.array([0.5, -1.0, 0.25, 0.0, 0.004], dtype=np.float32)
    first, tripled, zeros = encoded([vector, vector * 3, np.zeros(5, dtype=np.float32)], "int8")
    assert first.tolist() == [64, -127, 32, 0, 1]  # 0.5 x 127 = 63.5 -> 64 (half to even)
    assert tripled.tolist() == [64, -127, 32, 0, 1]  # the scale is the vector's own: no call mate moves it
    assert zeros.tolist() == [0, 0, 0, 0, 0]
    assert encoded([vector], "uint8")[0].tolist() == [192, 1, 160, 128, 129]


def test_int8_keeps_the_direction_within_half_a_step():
    rng = np.random.default_rng(0)
    vector = rng.standard_normal(384).astype(np.float32)
    back = encoded([vector], "int8")[0].astype(np.float32)
    cosine = float(vector @ back / np.linalg.norm(vector) / np.linalg.norm(back))
    assert cosine > 0.9999
    assert np.max(np.abs(back * np.abs(vector).max() / 127 - vector)) <= np.abs(vector).max() / 254 + 1e-6


def test_binary_packs_the_signs_high_bit_first_padding_the_last_byte():
    vector = np.array([1, -1, 0.1, 0, -2, 3, 3, -0.5, 0.2, -0.2], dtype=np.float32)  # 10 components: two bytes
    bits = "10100110" + "10" + "000000"
    assert encoded([vector], "ubinary")[0].tolist() == [int(bits[:8], 2), int(bits[8:], 2)]  # [166, 128]
    assert encoded([vector, -vector], "binary")[0].tolist() == [166 - 128, 128 - 128]


def test_float_types_pass_and_base64_takes_a_list_too():
    assert encoded([[0.5, 1.0]], "float") == [[0.5, 1.0]]
    raw = base64.b64decode(encoded([[0.5, 1.0]], "base64")[0])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, 1.0]
