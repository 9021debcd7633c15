"""The pieces the OpenAPI document (`openapi`) builds its paths and schemas from: references, error
responses, and the fields and headers several routes share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REF = "#/components/schemas/"
ERROR_STATUSES = {
    "400": "the body or a parameter is wrong", "401": "no valid API key", "404": "no such model",
    "408": "the body did not arrive in time", "413": "the body is over max_body_bytes",
    "422": "this Idempotency-Key came before with another request",
    "429": "the tenant's rate limit", "500": "inference failed for this request", "503": "overloaded, draining, "
    "not ready or failing: retry after retry_after_ms", "504": "the deadline passed",
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_responses(schema: str, statuses: Iterable[str]) -> dict[str, Any]:
    return {s: json_body(ref(schema), ERROR_STATUSES[s]) for s in statuses}


def or_null(schema: Any) -> dict[str, Any]:
    """A field whose null means the same as its absence (as OpenAI's clients send it)."""
    return {"anyOf": [schema, {"type": "null"}]}


COMPUTE_ERRORS = ("400", "401", "404", "408", "413", "422", "429", "500", "503", "504")
GENERATION_FIELDS: dict[str, Any] = {key: or_null(schema) for key, schema in {
    "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": "integer"}, "ignore_eos": {"type": "boolean"}, "stream": {"type": "boolean"},
    "stop": {"oneOf": [{"type": "string", "minLength": 1},
                       {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4}]},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
    "top_k": {"type": "integer", "minimum": -1}, "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "min_tokens": {"type": "integer", "minimum": 0},
    "structured_outputs": {"type": "object", "description": "vLLM's: one of json, regex, choice, grammar, json_object"},
    "user": {"type": "string"},
}.items()}
RESPONSE_FORMAT = or_null({"type": "object", "description": "text, json_object, or json_schema with its schema"})
TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"}, "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "description": {"type": "string"}, "parameters": {"type": "object"}}}}}
CHOICES = or_null({"type": "integer", "minimum": 1, "maximum": 16, "description": "choices to generate for the prompt"})
TIMEOUT = or_null({"type": "integer", "minimum": 1, "description": "this request's deadline, capped at max_timeout_ms"})
MODEL = or_null({"type": "string", "description": "default: the first configured model"})
DIMENSIONS = or_null({"type": "integer", "minimum": 1,
                        "description": "the first N components of each vector (normalised again where the model's are)"})
# One Server-Sent Event: `data` a JSON chunk (or [DONE]); `event: error` for a failure mid-stream.
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}, "event": {"enum": ["message", "error"]}}}
# Headers a compute request may carry: a key answered once per tenant, and a request for a fresh result.
HEADERS = [
    {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 255},
     "description": "a repeat gets the first answer again (Idempotent-Replayed: true); another body with it, 422"},
    {"name": "Cache-Control", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "no-cache: compute afresh rather than answer from the model's result cache"},
]
# Text Embeddings Inference's tokeniser routes (`tokens`): no batching, no key answered once.
_TOKEN = {"type": "object", "required": ["id", "text", "special"], "properties": {
    "id": {"type": "integer", "minimum": 0}, "text": {"type": "string"}, "special": {"type": "boolean"},
    "start": or_null({"type": "integer", "minimum": 0}), "stop": or_null({"type": "integer", "minimum": 0})}}
TOKEN_PATHS: dict[str, Any] = {
    "/tokenize": {"post": {
        "summary": "Text Embeddings Inference's tokenize: each text's tokens as the model reads it",
        "description": "TEI's body (`inputs`) for a batch model's tokeniser; vLLM's (`prompt` or `messages`) for a "
                       "generation model's, answered in vLLM's shape.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
            {"type": "object", "required": ["inputs"], "properties": {
                "inputs": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
                "add_special_tokens": {"type": "boolean"}, "prompt_name": {"type": "null"}, "model": MODEL}},
            {"type": "object", "required": ["prompt"], "properties": {
                "prompt": {"type": "string"}, "model": MODEL, "add_special_tokens": {"const": True}}},
            {"type": "object", "required": ["messages"], "properties": {
                "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}}, "model": MODEL,
                "add_generation_prompt": {"const": True}}}]}}}},
        "responses": {"200": json_body({"oneOf": [
            {"type": "array", "items": {"type": "array", "items": _TOKEN}},
            {"type": "object", "required": ["count", "max_model_len", "tokens"], "properties": {
                "count": {"type": "integer", "minimum": 0}, "max_model_len": {"type": "integer"},
                "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}, "token_strs": {"type": "null"}}}]},
            "TEI's body: one list of tokens per text, in order; vLLM's: the prompt's token ids"),
                      **error_responses("Error", ("400", "401", "404", "408", "413", "503"))},
    }},
    "/decode": {"post": {
        "summary": "Text Embeddings Inference's decode: token ids back to text",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["ids"], "properties": {
                "ids": {"oneOf": [{"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                                  {"type": "array", "minItems": 1, "items": {
                                      "type": "array", "items": {"type": "integer", "minimum": 0}}}]},
                "skip_special_tokens": {"type": "boolean"}, "model": MODEL}}}}},
        "responses": {"200": json_body({"type": "array", "items": {"type": "string"}}, "one text per list of ids"),
                      **error_responses("Error", ("400", "401", "404", "408", "413", "503"))},
    }},
}
