"""The wire formats of a text classifier's routes: vLLM's `POST /v1/classify` and Text Embeddings
Inference's `POST /predict`. Each text is an input of its own, batched like a `/v1/inference` request;
the model's output per text is its label, that label's probability and every label's (`scores`, in the
model's label order; the text backend's `task = "classification"`).

- `/v1/classify` (vLLM's shape): `input` a string or strings; answered as `data` items of `index`,
  `label`, `probs` (in label order) and `num_classes`, with `usage`; errors in OpenAI's shape.
- `/predict` (TEI's shape): `inputs` a string, or `[string]` (answered as one list of `{score, label}`,
  best first), or a batch `[[string], ...]` (a list of such lists); `raw_scores: true` (logits) and pairs
  of texts (`[a, b]`, `[[a, b]]`) are refused with a 400
  (the model gives probabilities of one text), `truncate` and `truncation_direction` as `/embed` takes
  them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .inference_body import timeout_ms, without_infinity_defaults
from .json_values import json_object


@dataclass(slots=True)
class ClassifyBody:
    """A parsed `/v1/classify` or `/predict` body."""

    items: list[str]
    model: str | None
    timeout_ms: int | None
    single: bool = False  # TEI: one text, answered as one list rather than a list of lists
    truncate: bool | None = None  # TEI's `truncate`; None: the model's own rule

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def inputs(self) -> list[str]:
        for i, item in enumerate(self.items):
            if not isinstance(item, str):
                raise InvalidInput(f"input {i} must be a string (a pair of texts is not classified here)")
            if not item:
                raise InvalidInput(f"input {i} is an empty string")
        return self.items


def _model(data: dict[str, Any]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("`model` must be a string")
    return model


def parse_classify_body(body: bytes) -> ClassifyBody:
    """vLLM's `/v1/classify` body: `input`, `model`, `timeout_ms`."""
    return _classify_call(json_object(body))


def _classify_call(data: dict[str, Any]) -> ClassifyBody:
    value = data.get("input")
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise InvalidInput("`input` must be a string or a non-empty array of strings")
    return ClassifyBody(items, _model(data), timeout_ms(data))


def parse_infinity_classify_body(body: bytes) -> ClassifyBody:
    """Infinity's `/classify` body: `input` (a string or strings), `model`; `raw_scores: true` refused,
    as on `/predict`."""
    data = without_infinity_defaults(json_object(body))
    if data.get("raw_scores") not in (None, False):
        raise InvalidInput("`raw_scores: true` is not served: the model gives each label's probability")
    return _classify_call(data)


def parse_tei_predict_body(body: bytes) -> ClassifyBody:
    """TEI's `/predict` body: `inputs`, `raw_scores`, `truncate`, `truncation_direction`."""
    data = json_object(body)
    value = data.get("inputs")
    if data.get("raw_scores") not in (None, False):
        raise InvalidInput("`raw_scores: true` is not served: the model gives each label's probability")
    truncate = data.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise InvalidInput("`truncate` must be a boolean")
    if data.get("truncation_direction") not in (None, "Right", "right"):
        raise InvalidInput('`truncation_direction` must be "Right": this server truncates inputs on the right')
    if isinstance(value, str):
        return ClassifyBody([value], _model(data), timeout_ms(data), True, truncate)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):  # TEI's one sequence
        if len(value) > 1:
            raise InvalidInput("`inputs` as two strings is a pair of texts, which this model does not classify; "
                               'a batch is an array of one-string arrays: [["a"], ["b"]]')
        return ClassifyBody(value, _model(data), timeout_ms(data), True, truncate)
    if not isinstance(value, list) or not value or not all(isinstance(v, list) for v in value):
        raise InvalidInput('`inputs` must be a string, or a batch: an array of one-string arrays ([["a"], ["b"]])')
    if any(len(v) != 1 for v in value):
        raise InvalidInput("each of `inputs` must hold one string (a pair of texts is not classified here)")
    return ClassifyBody([v[0] for v in value], _model(data), timeout_ms(data), False, truncate)


def classify_payload(call: ClassifyBody, outputs: list[dict[str, Any]], model: str, request_id: str,
                     tokens: int) -> dict[str, Any]:
    """vLLM's `/v1/classify` answer (the arguments a call of several inputs is answered with)."""
    return {
        "id": f"classify-{request_id}", "object": "list", "created": int(time.time()), "model": model,
        "data": [{"index": i, "label": out["label"], "probs": list(out["scores"].values()), "num_classes": len(out["scores"])}
                 for i, out in enumerate(outputs)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


def tei_predict_payload(call: ClassifyBody, outputs: list[dict[str, Any]], model: str, request_id: str, tokens: int) -> Any:
    """TEI's `/predict` answer: each text's labels, best first."""
    ranked = [[{"score": score, "label": label} for label, score in sorted(out["scores"].items(), key=lambda kv: -kv[1])]
              for out in outputs]
    return ranked[0] if call.single else ranked


def infinity_classify_payload(call: ClassifyBody, outputs: list[dict[str, Any]], model: str, request_id: str,
                              tokens: int) -> dict[str, Any]:
    """Infinity's `/classify` answer: per text, every label's `{score, label}`, best first."""
    return {"object": "classify", "data": tei_predict_payload(ClassifyBody(call.items, model, None), outputs, model, request_id, tokens),
            "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "id": request_id,
            "created": int(time.time())}
