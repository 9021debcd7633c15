"""An image input's size from its header, read without decoding its pixels, and the strict base64 both
the header and the whole image are read with."""

from __future__ import annotations

import io
from typing import Any

import pybase64

HEADER_BYTES = 16 << 10  # where every allowed format's size lies, but a JPEG's after large metadata


def header_pixels(image_module: Any, item: Any, max_pixels: int) -> int:
    """Width x height of an image input (bytes, or `{"image": base64 or data URL}`) from its first
    `HEADER_BYTES` (the whole input where its header lies further in); over `max_pixels` for one Pillow
    calls a decompression bomb; 0 where it cannot be read (its own preparation answers that).
    `image_module`: PIL.Image, imported by the caller."""
    for limit in (HEADER_BYTES, None):
        try:
            width, height = image_module.open(io.BytesIO(head(item, limit))).size
            return int(width * height)
        except image_module.DecompressionBombError:
            return max_pixels + 1
        except Exception:  # noqa: BLE001 - cut short, not an image, not base64: try it whole, then leave it
            continue
    return 0


def head(item: Any, limit: int | None) -> bytes:
    """The first `limit` bytes of an image input (all of it: None), without decoding the rest."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item[:limit] if limit else item)
    text = item["image"]
    if text[:5] in ("data:", b"data:"):
        text = text[text.index("," if isinstance(text, str) else b",") + 1:]
    if limit is None:
        return b64decode(text)
    return b64decode(text[:-(-limit // 3) * 4])[:limit]


def b64decode(text: str | bytes) -> bytes:
    """Strict base64, with pybase64 (SIMD): a 5.5 MB image in 0.8 ms. binascii took 17 ms and held the
    GIL all along, which stalled the event loop for as long (measured, 22 ms)."""
    return pybase64.b64decode(text, validate=True)
