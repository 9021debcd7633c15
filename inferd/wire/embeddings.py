"""The wire format of OpenAI's `POST /v1/embeddings`: the body and the answer (errors in OpenAI's shape
are written by `responses`).

`input` is a string, an array of strings, an array of token ids, or an array of token-id arrays; for an
image model, `{"image": base64}` or an array of them (Jina's and Infinity's shape). Each
item becomes an input of its own, batched like a single `/v1/inference` request (items of one call may
run in different batches); the answer keeps their order. Kept apart from the handler so the rules read
in one place, as `inference_body` does for `/v1/inference`.

Text Embeddings Inference's `POST /embed` is the same computation: `inputs` (a string or strings, or token
ids), `normalize`, `truncate`, `truncation_direction`, answered as an array of vectors; its `/embed_all`
answers each input with its tokens' vectors instead (an array of (tokens, width) arrays). `dimensions` (both
routes) cuts each vector to its first N components, normalised again where the model's vectors are unit
length (OpenAI's and TEI's rule); the model says which sizes it takes (`embedding_sizes`).
`encoding_format` takes the compact types too (int8, uint8, binary, ubinary: `vector_types`).

Cohere's `POST /v2/embed` is the same computation again: `texts`, `input_type`, `embedding_types` (any
of float, base64 and the compact types, each answered under its name), `truncate` ("END", the default,
as the model truncates; "NONE" as TEI's `truncate: false`; "START" refused: inputs are cut on the
right) and `output_dimension` (as `dimensions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInput
from ..messages import EveryToken
from .image_strings import json_object_with_images
from .inference_body import encoding_format, image_item, timeout_ms, without_infinity_defaults
from .json_values import json_object
from .vector_types import VECTOR_TYPES, encoded

Item = str | list[int] | dict[str, str]


@dataclass(slots=True)
class EmbeddingsBody:
    """A parsed `/v1/embeddings` body."""

    items: list[Item]
    model: str | None
    encodings: tuple[str, ...]  # the wire types asked (`vector_types`): one, or Cohere's several
    timeout_ms: int | None
    dimensions: int | None = None  # the first N components only
    normalize: bool | None = None  # TEI's `normalize` (its default true); None: as the model gives them
    truncate: bool | None = None  # TEI's `truncate`; None: the model's own rule
    similarity: bool = False  # TEI's `/similarity`: answered with each item's cosine to the first (`similarities`)
    every_token: bool = False  # TEI's `/embed_all`: each item's tokens' vectors, its inputs `EveryToken`

    @property
    def count(self) -> int:
        """How many inputs it holds, known before any is checked (a per-call cap is checked first)."""
        return len(self.items)

    @property
    def inputs(self) -> list[Any]:
        """Its inputs, each checked here: after the cap, so that 200,000 one-token items are refused
        for their number at once, not read one by one first (they held the loop ~50 ms a body)."""
        for i, item in enumerate(self.items):
            if isinstance(item, str):
                if not item:
                    raise InvalidInput(f"`input[{i}]` is an empty string")
            elif self.every_token and not _is_token_ids(item):
                raise InvalidInput(f"`inputs[{i}]` must be a string or a non-empty array of token ids (integers)")
            elif not _is_token_ids(item) and image_item(item) is None:
                raise InvalidInput(f"`input[{i}]` must be a string, a non-empty array of token ids (integers), "
                                   'or {"image": base64} for an image model')
        if self.every_token:
            return [EveryToken(item) for item in self.items]  # type: ignore[arg-type]  # (texts and ids, checked above)
        return self.items


def parse_embeddings_body(body: bytes) -> EmbeddingsBody:
    return _openai_call(json_object_with_images(body))


def parse_infinity_embeddings_body(body: bytes) -> EmbeddingsBody:
    """Infinity's `/embeddings`: OpenAI's body as Infinity's client sends it (its unasked defaults,
    `without_infinity_defaults`), `modality` text only (an image model takes `{"image": ...}` items)."""
    data = without_infinity_defaults(json_object_with_images(body))
    if data.get("modality", "text") != "text":
        raise InvalidInput('`modality` must be "text": an image model takes {"image": base64} items as input')
    return _openai_call(data)


def _openai_call(data: dict[str, Any]) -> EmbeddingsBody:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    return EmbeddingsBody(_items(data.get("input")), model, (encoding_format(data, VECTOR_TYPES),), timeout_ms(data),
                          _dimensions(data))


def parse_tei_embed_body(body: bytes) -> EmbeddingsBody:
    """TEI's `/embed` body: `inputs`, `normalize` (default true), `truncate`, `truncation_direction` (the
    model cuts on the right only), `dimensions`; `prompt_name` is refused (no prompts are configured)."""
    return _tei_embed_call(json_object(body))


def parse_tei_similarity_body(body: bytes) -> EmbeddingsBody:
    """TEI's `/similarity` body: `inputs: {source_sentence, sentences}` (and `/embed`'s `truncate`):
    the source sentence and each sentence, embedded as the items of one call."""
    return _similarity_call(json_object(body))


def parse_tei_root_embed_body(body: bytes) -> EmbeddingsBody:
    """TEI's `POST /` for an embedding model: `/embed`'s body, or `/similarity`'s (where Hugging Face's
    `InferenceClient.sentence_similarity` posts it: `inputs` an object)."""
    data = json_object(body)
    return _similarity_call(data) if isinstance(data.get("inputs"), dict) else _tei_embed_call(data)


def parse_tei_embed_all_body(body: bytes) -> EmbeddingsBody:
    """TEI's `/embed_all` body: `/embed`'s `inputs`, `truncate` and `truncation_direction`; each input is
    answered with its tokens' vectors (`EveryToken`), so `normalize` and `dimensions`, a pooled vector's,
    are refused rather than ignored."""
    data = json_object(body)
    for name in ("normalize", "dimensions"):
        if data.get(name) is not None:
            raise InvalidInput(f"`{name}` is not served on /embed_all: each token's vector comes as the model gives it")
    call = _tei_embed_call(data)
    call.every_token, call.normalize = True, None
    return call


def _similarity_call(data: dict[str, Any]) -> EmbeddingsBody:
    inputs = data.get("inputs")
    sentences = inputs.get("sentences") if isinstance(inputs, dict) else None
    source = inputs.get("source_sentence") if isinstance(inputs, dict) else None
    if not isinstance(source, str) or not isinstance(sentences, list) or not sentences \
            or not all(isinstance(s, str) for s in sentences):
        raise InvalidInput('`inputs` must be {"source_sentence": a text, "sentences": [texts]}')
    call = _tei_embed_call({**data, "inputs": [source, *sentences]})
    call.similarity, call.normalize = True, None  # (cosines: whatever the vectors' norms)
    return call


def similarities(vectors: list[Any]) -> list[float]:
    """Each vector's cosine similarity to the first (TEI's `/similarity` answer: one per sentence)."""
    rows = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1)
    norms[norms == 0] = 1.0
    return [float(x) for x in (rows[1:] @ rows[0]) / (norms[1:] * norms[0])]


def _tei_embed_call(data: dict[str, Any]) -> EmbeddingsBody:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    flags = {name: data.get(name) for name in ("normalize", "truncate")}
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise InvalidInput(f"`{name}` must be a boolean")
    if data.get("truncation_direction") not in (None, "Right", "right"):
        raise InvalidInput('`truncation_direction` must be "Right": this server truncates inputs on the right')
    if data.get("prompt_name") is not None:
        raise InvalidInput("`prompt_name` is not served: no prompts are configured for this model")
    return EmbeddingsBody(_items(data.get("inputs"), "inputs"), model, ("float",), timeout_ms(data), _dimensions(data),
                          flags["normalize"] is not False, flags["truncate"])  # (TEI normalises unless told not to)


_COHERE_INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")


def parse_cohere_embed_body(body: bytes) -> EmbeddingsBody:
    """Cohere's `/v2/embed` body (see the module docstring); `images` and `inputs` are refused: this route
    embeds texts (an image model takes `/v1/embeddings`)."""
    data = json_object(body)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    for field in ("images", "inputs"):
        if data.get(field) is not None:
            raise InvalidInput(f"`{field}` is not served on /v2/embed: send `texts` (an image model takes /v1/embeddings)")
    texts = data.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidInput("`texts` must be a non-empty array of strings")
    input_type = data.get("input_type")
    if input_type is not None and input_type not in _COHERE_INPUT_TYPES:
        raise InvalidInput(f"`input_type` must be one of {', '.join(_COHERE_INPUT_TYPES)}")
    kinds = data.get("embedding_types", ["float"])
    if not isinstance(kinds, list) or not kinds or any(k not in VECTOR_TYPES for k in kinds):
        raise InvalidInput(f"`embedding_types` must be a non-empty array of {', '.join(VECTOR_TYPES)}")
    truncate = data.get("truncate", "END")
    if truncate not in ("END", "NONE", "START"):
        raise InvalidInput('`truncate` must be "END", "NONE" or "START"')
    if truncate == "START":
        raise InvalidInput('`truncate: "START"` is not served: this server truncates inputs at the end')
    return EmbeddingsBody(list(texts), model, tuple(dict.fromkeys(kinds)), timeout_ms(data),
                          _dimensions(data, "output_dimension"), None, False if truncate == "NONE" else None)


def _dimensions(data: dict[str, Any], field: str = "dimensions") -> int | None:
    value = data.get(field)
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidInput(f"`{field}` must be a positive integer")
    return value


def _items(value: Any, field: str = "input") -> list[Item]:
    if isinstance(value, str) or image_item(value) is not None:
        items: list[Any] = [value]
    elif _is_token_ids(value):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidInput(f"`{field}` must be a string, an array of strings, or an array of token-id arrays")
    if not items:
        raise InvalidInput(f"`{field}` must hold at least one item")
    return items  # (each checked by `EmbeddingsBody.inputs`, once their number is)


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def shaped(vectors: list[Any], call: EmbeddingsBody, normalized: bool) -> list[Any]:
    """The vectors as the call asks: cut to `dimensions` (a new array: a cached vector is shared) and
    normalised again where the model's were unit length; a model's raw vectors normalised where TEI's
    `normalize` asks it (its `normalize: false` on a normalising model is refused before)."""
    size = call.dimensions
    normalize = normalized and size is not None or not normalized and call.normalize is True
    if size is None and not normalize:
        return vectors
    out = []
    for vector in vectors:
        if size is not None:
            vector = vector[:size]
        if normalize:
            norm = float((vector * vector).sum()) ** 0.5 if hasattr(vector, "sum") else sum(x * x for x in vector) ** 0.5
            if norm > 0:
                vector = vector / norm if hasattr(vector, "sum") else [x / norm for x in vector]
        out.append(vector)
    return out


def embeddings_payload(model: str, vectors: list[Any], tokens: int, encoding: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(encoded(vectors, encoding))],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def cohere_embed_payload(call: EmbeddingsBody, vectors: list[Any], request_id: str, tokens: int) -> dict[str, Any]:
    """Cohere's `/v2/embed` answer: the vectors under each type asked, the texts, the tokens billed."""
    return {
        "id": request_id,
        "embeddings": {kind: encoded(vectors, kind) for kind in call.encodings},
        "texts": call.items,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        "response_type": "embeddings_by_type",
    }
