"""The wire format of OpenAI's `POST /v1/embeddings`: the body and the answer (errors in OpenAI's shape
are written by `responses`).

`input` is a string, an array of strings, an array of token ids, or an array of token-id arrays; for an
image model, `{"image": base64}` or an array of them (Jina's and Infinity's shape). Each
item becomes an input of its own, batched like a single `/v1/inference` request (items of one call may
run in different batches); the answer keeps their order. Kept apart from the handler so the rules read
in one place, as `inference_body` does for `/v1/inference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .image_strings import json_object_with_images
from .inference_body import encode_vector, encoding_format, image_item, timeout_ms

Item = str | list[int] | dict[str, str]


@dataclass(slots=True)
class EmbeddingsCall:
    """A parsed `/v1/embeddings` body."""

    items: list[Item]
    model: str | None
    base64: bool
    timeout_ms: int | None

    @property
    def count(self) -> int:
        """How many inputs it holds, known before any is checked (a per-call cap is checked first)."""
        return len(self.items)

    @property
    def inputs(self) -> list[Item]:
        """Its inputs, each checked here: after the cap, so that 200,000 one-token items are refused
        for their number at once, not read one by one first (they held the loop ~50 ms a body)."""
        for i, item in enumerate(self.items):
            if isinstance(item, str):
                if not item:
                    raise InvalidInput(f"`input[{i}]` is an empty string")
            elif not _is_token_ids(item) and image_item(item) is None:
                raise InvalidInput(f"`input[{i}]` must be a string, a non-empty array of token ids (integers), "
                                   'or {"image": base64} for an image model')
        return self.items


def parse_embeddings_body(body: bytes) -> EmbeddingsCall:
    data = json_object_with_images(body)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    if data.get("dimensions") is not None:
        raise InvalidInput("`dimensions` is not supported: the model's own size is returned")
    return EmbeddingsCall(_items(data.get("input")), model, encoding_format(data) == "base64", timeout_ms(data))


def _items(value: Any) -> list[Item]:
    if isinstance(value, str) or image_item(value) is not None:
        items: list[Any] = [value]
    elif _is_token_ids(value):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidInput("`input` must be a string, an array of strings, or an array of token-id arrays")
    if not items:
        raise InvalidInput("`input` must hold at least one item")
    return items  # (each checked by `EmbeddingsCall.inputs`, once their number is)


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def embeddings_payload(model: str, vectors: list[Any], tokens: int, base64: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, base64=base64)}
                 for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
