"""An image's size read from its header: as bytes, base64 and a data URL; a bomb; what cannot be read."""

from __future__ import annotations

import base64
import io

import pytest

Image = pytest.importorskip("PIL.Image")

from inferd.backends.image_headers import HEADER_BYTES, head, header_pixels  # noqa: E402


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="PNG")
    return out.getvalue()


def test_the_size_comes_from_the_header_however_the_image_is_sent():
    data = _png(30, 20)
    text = base64.b64encode(data)
    for item in (data, {"image": text.decode()}, {"image": text}, {"image": "data:image/png;base64," + text.decode()}):
        assert header_pixels(Image, item, 10**6) == 600


def test_only_the_first_bytes_are_decoded():
    data = _png(10, 10) + bytes(100_000)
    assert head({"image": base64.b64encode(data).decode()}, HEADER_BYTES) == data[:HEADER_BYTES]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_bomb_counts_over_the_limit_and_what_cannot_be_read_counts_nothing():
    bomb = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(bomb, format="PNG")  # 144 million pixels: over Pillow's own guard
    assert header_pixels(Image, bomb.getvalue(), 40_000_000) > 40_000_000
    for junk in (b"%PDF-1.4", {"image": "***"}, {"image": 3}, "text", _png(10, 10)[:20]):
        assert header_pixels(Image, junk, 40_000_000) == 0
