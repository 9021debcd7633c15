"""Compact vector types on the wire: an embedding as int8, uint8, binary or ubinary instead of float32
(Cohere's `embedding_types`, and `encoding_format` on `/v1/embeddings`), for vector stores that keep
them (a quarter and a thirty-second of the bytes).

- int8: each vector scaled by its own largest magnitude to [-127, 127] and rounded ("absmax"): the
  direction, which cosine similarity reads, survives within half a step per component, and one
  vector's values never depend on which other inputs shared its batch (a scale fitted on the batch
  would make them);
- uint8: the int8 values plus 128 (1 to 255);
- binary / ubinary: one bit per component, set where it is positive, packed eight to a byte with the
  first component in the highest bit (numpy's `packbits`, zero bits padding the last byte); ubinary
  gives each byte as 0-255, binary as the byte minus 128 (-128 to 127), as Cohere and
  sentence-transformers write them.
"""

from __future__ import annotations

from typing import Any

from .inference_body import encode_vector

FLOAT_TYPES = ("float", "base64")
COMPACT_TYPES = ("int8", "uint8", "binary", "ubinary")
VECTOR_TYPES = FLOAT_TYPES + COMPACT_TYPES


def encoded(vectors: list[Any], kind: str) -> list[Any]:
    """`vectors` (float arrays or lists, one call's) in the wire type `kind` (one of VECTOR_TYPES). The
    compact types are made for the call's vectors at once (one array's operations, not one per vector:
    per vector they cost more of the loop than the float32 they replace)."""
    if kind in FLOAT_TYPES:
        if kind == "float":
            return [encode_vector(v, base64=False) for v in vectors]
        import numpy

        return [encode_vector(v if hasattr(v, "astype") else numpy.asarray(v, dtype=numpy.float32), base64=True)
                for v in vectors]
    import numpy  # (a compact type is asked of an embedding model, whose backend brought numpy)

    values = numpy.asarray(vectors, dtype=numpy.float32).reshape(len(vectors), -1)
    if kind in ("binary", "ubinary"):
        packed = numpy.packbits(values > 0, axis=1)
        return list((packed.astype(numpy.int16) - 128).astype(numpy.int8) if kind == "binary" else packed)
    largest = numpy.abs(values).max(axis=1, keepdims=True) if values.size else numpy.zeros((len(values), 1), numpy.float32)
    scale = numpy.divide(127.0, largest, out=numpy.zeros_like(largest), where=largest > 0)
    scaled = numpy.rint(values * scale)
    return list(scaled.astype(numpy.int8) if kind == "int8" else (scaled + 128).astype(numpy.uint8))
