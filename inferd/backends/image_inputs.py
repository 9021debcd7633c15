"""The way into an image model: bytes or `{"image": base64}` (a data URL or plain base64; a str, or
ASCII bytes where it was lifted from a large JSON body) to a decoded RGB array resized to its size
bucket, with the model's limits.

It runs on the model's preprocessing threads, never on the event loop, in the micro-batches the
preprocessor gathers (Pillow releases the GIL while it decodes). Before any pixel is decoded, the
header is checked: the format must be one of `formats`, the image at most `max_image_bytes` (413) and
`max_pixels` (413: a decompression bomb is refused before it expands), and not empty (400). A
truncated or corrupt file is a 400 for that input alone. A call of several images is refused whole (413)
when their headers add up past `max_call_pixels`, on the event loop before any is decoded (`check_call`:
a header costs microseconds): 60 one-colour 6300x6300 WEBPs of 1.6 KB each, 40 million pixels apiece and
~1.5 s each to decode, once held the decoding thread for 36 s. Kept apart from the forward (`vision`)
as `text_inputs` is from `transformer`: its rules are the model's input contract.
"""

from __future__ import annotations

import binascii
import io
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import PayloadTooLarge
from . import Prepared
from .image_headers import b64decode, header_pixels

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")


class ImageInputs:
    """One model's image decoding and limits (its options `max_image_bytes`, `max_pixels`,
    `max_call_pixels`, `formats`); `patches`: each size's patch count, its inputs' "tokens"."""

    def __init__(self, image: Any, sizes: Sequence[int], patches: Mapping[int, int], options: Mapping[str, Any]) -> None:
        self._image = image  # (PIL.Image, imported by the model)
        # Pillow warns past its own pixel limit as it opens a header; `max_pixels` is checked right after.
        warnings.filterwarnings("ignore", category=image.DecompressionBombWarning)
        self.image_sizes = tuple(sizes)
        self.patches = dict(patches)
        self.max_image_bytes = int(options.get("max_image_bytes", 20 << 20))
        self.max_pixels = int(options.get("max_pixels", 40_000_000))
        self.max_call_pixels = int(options.get("max_call_pixels", 200_000_000))
        self.formats = tuple(f.upper() for f in options.get("formats", FORMATS))

    def prepare_batch(self, items: Sequence[Any]) -> list[Prepared | Exception]:
        """Each image decoded, checked and resized to its size bucket (an (s, s, 3) uint8 RGB array), or
        the Exception that answers that input alone."""
        results: list[Prepared | Exception] = []
        for item in items:
            try:
                results.append(self._prepared(self._bytes(item)))
            except (ValueError, PayloadTooLarge) as exc:
                results.append(exc)
            except Exception as exc:  # noqa: BLE001 - whatever a decoder raises, this input alone is at fault
                results.append(ValueError(f"image cannot be read ({type(exc).__name__}: {exc})"))
        return results

    def check_call(self, items: Sequence[Any]) -> None:
        """Refuse a call whose images add up past `max_call_pixels`, from their headers alone (on the event
        loop: a few kilobytes decoded and parsed per image). An image whose header cannot be read counts
        nothing here: its own preparation answers it."""
        total = 0
        for item in items:
            total += header_pixels(self._image, item, self.max_pixels)
            if total > self.max_call_pixels:
                raise PayloadTooLarge(f"this call's {len(items)} images hold over {self.max_call_pixels} pixels "
                                      f"in all; this model takes at most that many per call (max_call_pixels)")

    def _bytes(self, item: Any) -> bytes:
        if isinstance(item, (bytes, bytearray, memoryview)):
            data = bytes(item)
        elif isinstance(item, Mapping) and isinstance(item.get("image"), (str, bytes)):
            text = item["image"]  # (bytes: lifted from a large JSON body as it was, `image_strings`)
            prefix, comma, tag = ("data:", ",", ";base64") if isinstance(text, str) else (b"data:", b",", b";base64")
            if text.startswith(prefix):
                header, _, text = text.partition(comma)
                if not header.endswith(tag):
                    raise ValueError("an image data URL must be base64 (data:image/...;base64,...)")
            if len(text) > (self.max_image_bytes + 2) // 3 * 4 + 4:
                raise PayloadTooLarge(f"image is over this model's max_image_bytes ({self.max_image_bytes})")
            try:
                data = b64decode(text)
            except (binascii.Error, ValueError):
                raise ValueError("`image` is not valid base64") from None
        else:
            raise ValueError('this model takes images: {"image": "<base64 or data URL>"}')
        if len(data) > self.max_image_bytes:
            raise PayloadTooLarge(f"image is {len(data)} bytes; this model takes at most {self.max_image_bytes} (max_image_bytes)")
        return data

    def _prepared(self, data: bytes) -> Prepared:
        Image = self._image
        try:
            image = Image.open(io.BytesIO(data), formats=self.formats)  # reads the header only
        except Image.UnidentifiedImageError:
            raise ValueError(f"not an image in an allowed format ({', '.join(self.formats)})") from None
        except Image.DecompressionBombError:
            raise PayloadTooLarge(f"image is over this model's max_pixels ({self.max_pixels})") from None
        except (OSError, SyntaxError, ValueError) as exc:  # a header cut short or corrupt
            raise ValueError(f"image data is truncated or corrupt ({exc})") from None
        width, height = image.size
        if width == 0 or height == 0:
            raise ValueError(f"image is {width}x{height}: empty")
        if width * height > self.max_pixels:
            raise PayloadTooLarge(f"image is {width}x{height} = {width * height} pixels; this model takes at most "
                                  f"{self.max_pixels} (max_pixels)")
        longest = max(width, height)
        bucket = next((i for i, size in enumerate(self.image_sizes) if size >= longest), len(self.image_sizes) - 1)
        size = self.image_sizes[bucket]
        try:
            rgb = image.convert("RGB")  # decodes
        except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
            raise ValueError(f"image data is truncated or corrupt ({exc})") from None
        if rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
        return Prepared(np.asarray(rgb), bucket, self.patches[size])
