"""The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.

Written by hand, next to the handlers it describes, and kept true two ways: a test checks that its
paths are exactly the server's routes, and schemathesis sends it generated requests against a live
server (tests/e2e/test_openapi.py) and checks every answer against it: no 500, no undocumented status,
no body outside its schema. A server without a generation model serves it without the OpenAI text
endpoints.

Its paths are here; the named schemas they refer to (`ref(name)`) are in `schemas`, and the
parts several paths share (references, error responses, common fields and headers, the tokeniser
routes) in `parts`. The test above checks the document whole against the routes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .examples import with_examples
from .parts import (
    CHOICES,
    COMPUTE_ERRORS,
    GENERATION_FIELDS,
    HEADERS,
    MODEL,
    RESPONSE_FORMAT,
    SSE_EVENT,
    TIMEOUT,
    TOKEN_PATHS,
    TOOL,
    error_responses,
    json_body,
    or_null,
    ref,
)
from .schemas import SCHEMAS

_INFERENCE = {
    "post": {
        "summary": "One input, one output: batched with other requests (or, for a generation model, generated)",
        "description": "An image model also takes the image itself as the body (Content-Type: image/..., the "
                       "model in the query: ?model=NAME&timeout_ms=N)",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("InferenceRequest")}}},
        "responses": {
            "200": {"description": "the output", "content": {
                "application/json": {"schema": ref("InferenceResponse")},
                "text/event-stream": {"schema": SSE_EVENT, "description": "generation with stream: true"}}},
            **error_responses("Error", COMPUTE_ERRORS),
        },
    }
}
_OPENAI_TEXT = {
    "parameters": HEADERS[:1],
    "responses": {
        "409": json_body(ref("OpenAIError"), "this Idempotency-Key's first request is still running"),
        "200": {"description": "the completion (or Server-Sent Events ending with data: [DONE])", "content": {
            "application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": SSE_EVENT}}},
        **error_responses("OpenAIError", COMPUTE_ERRORS),
    },
}


def _post(summary: str, body: dict[str, Any], answer: dict[str, Any], said: str, errors: str = "Error") -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": HEADERS, "requestBody": {"required": True, "content": {
        "application/json": {"schema": body}}}, "responses": {"200": json_body(answer, said), **error_responses(errors, COMPUTE_ERRORS)}}}


def _get(summary: str, schema: dict[str, Any], *errors: str, content_type: str = "application/json") -> dict[str, Any]:
    ok = {"description": summary, "content": {content_type: {"schema": schema}}}
    return {"get": {"summary": summary, "responses": {"200": ok, **error_responses("Error", errors)}}}


PATHS: dict[str, Any] = {
    "/v1/inference": _INFERENCE,
    "/api/inference": _INFERENCE,
    "/v1/embeddings": {"post": {
        "summary": "OpenAI's embeddings: each item batched like a request of its own, answered in order",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("EmbeddingsRequest")}}},
        "responses": {"200": json_body(ref("EmbeddingsResponse"), "one embedding per item, in order"),
                      **error_responses("OpenAIError", COMPUTE_ERRORS)},
    }},
    "/v1/rerank": _post("Cohere's rerank (Jina's clients too): each (query, document) pair batched like a request, "
                        "answered best first", ref("RerankRequest"), ref("RerankResponse"), "the documents' scores, best first"),
    "/rerank": {"post": {
        "summary": "Text Embeddings Inference's rerank (TEI's body and answer), or Infinity's (`documents`, no `texts`)",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("TeiRerankRequest")}}},
        "responses": {"200": json_body({"type": "array", "items": {
            "type": "object", "required": ["index", "score"], "properties": {
                "index": {"type": "integer", "minimum": 0}, "score": {"type": "number"}, "text": {"type": "string"}}}},
            "the texts' scores, best first"), **error_responses("Error", COMPUTE_ERRORS)},
    }},
    "/embed": {"post": {
        "summary": "Text Embeddings Inference's embed: the same computation as /v1/embeddings, TEI's body, an array "
                   "of vectors",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("TeiEmbedRequest")}}},
        "responses": {"200": json_body({"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                                   "one vector per input, in order"), **error_responses("Error", COMPUTE_ERRORS)},
    }},
    "/": {"post": {
        "summary": "Text Embeddings Inference's root, where Hugging Face's InferenceClient posts: /embed's body and "
                   "answer, or /predict's or /rerank's when the default model classifies or reranks",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "oneOf": [ref("TeiEmbedRequest"), ref("TeiRerankRequest"), ref("TeiSimilarityRequest")]}}}},
        "responses": {"200": json_body({"type": "array"}, "as /embed, /predict or /rerank answers"),
                      **error_responses("Error", COMPUTE_ERRORS)},
    }},
    "/v2/embed": _post("Cohere's embed: the same computation as /v1/embeddings, each vector in the types asked",
                       ref("CohereEmbedRequest"), ref("CohereEmbedResponse"), "the vectors by type, in the texts' order"),
    "/v1/classify": {"post": {
        "summary": "vLLM's classify: each text batched like a request of its own, every label's probability",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["input"], "properties": {
                "input": {"oneOf": [{"type": "string", "minLength": 1},
                                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}]},
                "model": MODEL, "timeout_ms": TIMEOUT}}}}},
        "responses": {"200": json_body({"type": "object", "required": ["id", "object", "model", "data", "usage"], "properties": {
            "data": {"type": "array", "items": {"type": "object", "required": ["index", "label", "probs", "num_classes"]}}}},
            "each text's label and probabilities, in order"), **error_responses("OpenAIError", COMPUTE_ERRORS)},
    }},
    "/predict": {"post": {
        "summary": "Text Embeddings Inference's predict: the same computation, each text's labels best first",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["inputs"], "properties": {
                "inputs": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {
                    "type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "minLength": 1}}}]},
                "raw_scores": {"const": False}, "truncate": or_null({"type": "boolean"}),
                "truncation_direction": {"enum": ["Right", "right"]}}}}}},
        "responses": {"200": json_body({"type": "array"}, "a text's [{score, label}], best first (a batch: one such list "
                                       "per text)"), **error_responses("Error", COMPUTE_ERRORS)},
    }},
    "/v1/completions": {"post": {"summary": "OpenAI's text completions (generation models)", "requestBody": {
        "required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "prompt"],
            "properties": {"model": {"type": "string"}, "timeout_ms": TIMEOUT, "n": CHOICES,
                           "logprobs": or_null({"type": "integer", "minimum": 0, "maximum": 20}),
                           "response_format": RESPONSE_FORMAT,
                           "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                                     "minItems": 1, "maxItems": 1}]},
                           **GENERATION_FIELDS}}}}}, **_OPENAI_TEXT}},
    "/v1/chat/completions": {"post": {"summary": "OpenAI's chat completions (generation models)", "requestBody": {
        "required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "messages"],
            "properties": {"model": {"type": "string"}, "timeout_ms": TIMEOUT, "n": CHOICES,
                           "logprobs": or_null({"type": "boolean"}),
                           "top_logprobs": or_null({"type": "integer", "minimum": 0, "maximum": 20}),
                           "response_format": RESPONSE_FORMAT,
                           "tools": or_null({"type": "array", "items": TOOL}),
                           "tool_choice": or_null({"oneOf": [{"enum": ["none", "auto", "required"]}, {
                               "type": "object", "required": ["type", "function"], "properties": {
                                   "type": {"const": "function"}, "function": {
                                       "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]}),
                           "parallel_tool_calls": or_null({"type": "boolean"}),
                           "messages": {"type": "array", "minItems": 1, "items": {
                               "type": "object", "required": ["role", "content"],
                               "properties": {"role": {"type": "string"}, "content": {"oneOf": [
                                   {"type": "string"}, {"type": "null"}, {"type": "array", "items": {
                                       "type": "object", "required": ["type", "text"],
                                       "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
                                   "tool_calls": {"type": "array", "items": {"type": "object"}},
                                   "tool_call_id": {"type": "string"}}}},
                           **GENERATION_FIELDS}}}}}, **_OPENAI_TEXT}},
    "/healthz": _get("the process is up", {"type": "object", "required": ["status"]}),
    "/health": {"get": {"summary": "TEI's and vLLM's probe: 200 when every model taking traffic can serve", "responses": {
        "200": json_body({"type": "object", "required": ["status"]}, "can serve"),
        "503": json_body({"type": "object", "required": ["status"]}, "cannot serve now (starting, draining, a model down)")}}},
    "/version": _get("the server's version (vLLM's route)", {"type": "object", "required": ["version"],
                                                             "properties": {"version": {"type": "string"}}}),
    "/info": _get("the default model (TEI's `model_id`) and every model's batch limits",
                  {"type": "object", "required": ["version", "model_id", "models"],
                   "properties": {"models": {"type": "array", "items": {"type": "object", "required": ["id", "kind"]}}}}),
    "/readyz": {"get": {"summary": "ready for traffic: serving, and every model ready", "responses": {
        "200": json_body(ref("Readiness"), "ready"), "503": json_body(ref("Readiness"), "not ready (starting, draining, a model down)")}}},
    "/v1/models": _get("every model, in OpenAI's list shape, with its settings and figures",
                       {"type": "object", "required": ["object", "data"],
                        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}}}},
                       "401"),
    "/v1/models/{model}": {"get": {
        "summary": "one model, as OpenAI's models.retrieve() reads it",
        "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": json_body({"type": "object", "required": ["id", "object"]}, "the model"),
                      **error_responses("OpenAIError", ("404",)), **error_responses("Error", ("401",))}}},
    "/v1/stats": _get("process figures (CPU, memory, in flight, connections) and each model's", {"type": "object"}, "401"),
    "/v1/limits": _get("the caller's tier, and per model its rate limit now and what is left", {"type": "object"}, "401"),
    "/v1/dead-letters": {"get": {"summary": "poison inputs isolated by bisection: ids, hashes, lengths (admin key)",
                                 "responses": {"200": json_body({"type": "object"}, "the entries"),
                                               **error_responses("Error", ("401",)), "403": json_body(ref("Error"), "not the admin key")}}},
    "/metrics": _get("Prometheus text format", {"type": "string"}, "401", content_type="text/plain"),
    "/openapi.json": _get("this document", {"type": "object"}),
    "/docs": _get("this document as an interactive page (Swagger UI, its files under /docs/)", {"type": "string"},
                  content_type="text/html"),
}
# The Open Inference Protocol (KServe v2): its own error shape; one version, "1", per model.
_V2_ERROR = ("OpenInferenceError",)
_V2_MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
_V2_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
_V2_INFER = {"post": {
    "summary": "Open Inference Protocol infer: each element of the BYTES input `text` batched like a request",
    "requestBody": {"required": True, "content": {"application/json": {"schema": ref("OpenInferenceRequest")}}},
    "responses": {"200": {"description": "the output tensor `output` (FP32 [N, D] for embeddings, else BYTES [N])",
                          "content": {"application/json": {"schema": ref("OpenInferenceResponse")},
                                      "application/octet-stream": {"description": "binary tensor data after the "
                                                                   "JSON header (Inference-Header-Content-Length)"}}},
                  **error_responses(*_V2_ERROR, COMPUTE_ERRORS)}}}
_V2_METADATA = {"get": {"summary": "a model's metadata: versions, input and output tensors",
                        "responses": {"200": json_body({"type": "object", "required": ["name", "versions", "inputs", "outputs"]},
                                                   "the model"), **error_responses(*_V2_ERROR, ("401", "404"))}}}
_V2_READY = {"get": {"summary": "whether the model is ready", "responses": {
    "200": json_body({"type": "object", "required": ["ready"]}, "ready"), **error_responses(*_V2_ERROR, ("401", "404", "503"))}}}
PATHS.update({
    "/v2": _get("server metadata", {"type": "object", "required": ["name", "version", "extensions"]}),
    "/v2/health/live": _get("the process is up", {"type": "object", "required": ["live"]}),
    "/v2/health/ready": {"get": {"summary": "serving, and every model ready", "responses": {
        "200": json_body({"type": "object", "required": ["ready"]}, "ready"), **error_responses(*_V2_ERROR, ("503",))}}},
})
_V2_STATS = {"get": {"summary": "the model's statistics, in Triton's shape (its statistics extension)", "responses": {
    "200": json_body({"type": "object", "required": ["model_stats"]}, "counts and times"), **error_responses(*_V2_ERROR, ("401", "404"))}}}
for _suffix, _item in (("", _V2_METADATA), ("/ready", _V2_READY), ("/stats", _V2_STATS), ("/infer", _V2_INFER)):
    for _prefix, _parameters in (("/v2/models/{model}", [_V2_MODEL]), ("/v2/models/{model}/versions/{version}",
                                                                        [_V2_MODEL, _V2_VERSION])):
        PATHS[_prefix + _suffix] = {method: {**op, "parameters": _parameters} for method, op in _item.items()}
PATHS.update(TOKEN_PATHS)
# Infinity's paths (without /v1; its rerank body on /rerank beside TEI's), TEI's /similarity and /embed_all, vLLM's /ping
PATHS["/embeddings"] = _post("Infinity's embeddings: OpenAI's body", ref("InfinityEmbeddingsRequest"),
                             ref("EmbeddingsResponse"), "one embedding per item, in order", "OpenAIError")
PATHS["/classify"] = _post("Infinity's classify: each text's labels, best first",
                           PATHS["/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"], {
    "type": "object", "required": ["object", "data", "model", "usage"], "properties": {
        "object": {"const": "classify"}, "data": {"type": "array", "items": {"type": "array"}}}}, "each text's labels")
PATHS["/similarity"] = _post("Text Embeddings Inference's similarity: each sentence's cosine to the source sentence",
                             ref("TeiSimilarityRequest"), {"type": "array", "items": {"type": "number"}},
                             "one similarity per sentence, in order")
PATHS["/embed_all"] = _post("Text Embeddings Inference's embed_all: each input's tokens' vectors, before pooling",
                            ref("TeiEmbedAllRequest"), {"type": "array", "items": PATHS["/embed"]["post"]["responses"]["200"][
                                "content"]["application/json"]["schema"]}, "per input, in order: each token's vector")
_rerank = PATHS["/rerank"]["post"]
_rerank["requestBody"]["content"]["application/json"]["schema"] = {"anyOf": [ref("TeiRerankRequest"), ref("RerankRequest")]}
_rerank["responses"]["200"]["content"]["application/json"]["schema"] = {"anyOf": [
    _rerank["responses"]["200"]["content"]["application/json"]["schema"], ref("InfinityRerankResponse")]}
PATHS["/models"] = _get("the batch models, as Infinity lists them (with their `capabilities`)", {
    "type": "object", "required": ["object", "data"], "properties": {"data": {"type": "array", "items": {
        "type": "object", "required": ["id", "stats", "capabilities"]}}}}, "401")
PATHS["/ping"] = {"get": dict(PATHS["/health"]["get"])}  # (its own operation: grouped under vLLM's)
_ADMIN_ERRORS = {**error_responses("Error", ("400", "401", "404")), "403": json_body(ref("Error"), "not the admin key"),
                 "409": json_body(ref("Error"), "the versions' states do not allow it")}
_VERSION_STATE = {"type": "object", "required": ["name", "version", "state"]}
PATHS.update({
    "/v1/admin/models": {
        "get": {"summary": "every model's versions, their states and traffic split (admin key)",
                "responses": {"200": json_body({"type": "object", "required": ["models"]}, "the models"), **_ADMIN_ERRORS}},
        "post": {"summary": "load a model version beside the running ones: a [[models]] table as JSON (admin key)",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["name", "backend"],
                     "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                    "backend": {"type": "string"}, "options": {"type": "object"}}}}}},
                 "responses": {"202": json_body(_VERSION_STATE, "loading"), **_ADMIN_ERRORS,
                               "507": json_body(ref("Error"), "it would not fit in memory")}},
    },
    "/v1/admin/models/{model}/traffic": {"put": {
        "summary": "the split of requests that name no version, e.g. {\"1\": 90, \"2\": 10} (admin key)",
        "parameters": [_V2_MODEL],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": {"type": "number", "minimum": 0}}}}},
        "responses": {"200": json_body({"type": "object", "required": ["name", "traffic"]}, "the new split"), **_ADMIN_ERRORS}}},
    "/v1/admin/models/{model}/versions/{version}": {"delete": {
        "summary": "drain and unload a version (admin key)", "parameters": [_V2_MODEL, _V2_VERSION],
        "responses": {"202": json_body(_VERSION_STATE, "draining"), **_ADMIN_ERRORS}}},
})
# Paths the route table does not hold (answered by a prefix: the Open Inference Protocol's, the admin
# API's), always in the document. (Cohere's /v2/embed is a route of its own.)
PARAMETRISED = {path for path in PATHS
                if "{" in path or path == "/v2" or path.startswith(("/v2/health/", "/v2/models/", "/v1/admin/"))}

with_examples(PATHS)  # (the interactive page's: a call the default config answers, and the route's group)
for _operations in PATHS.values():  # every route: a request with a method it does not take is a 405
    for _operation in _operations.values():
        _operation["responses"].setdefault("405", json_body(ref("Error"), "the path takes another method"))

def openapi_document(routes: Iterable[str], version: str) -> dict[str, Any]:
    """The document for a server with these routes (a server without a generation model has no
    `/v1/completions`)."""
    served = set(routes)
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd", "version": version,
                 "description": "A dynamic-batching inference server: one input per request, batched inside. Every "
                                "error is JSON with a stable code and the request id (OpenAI's shape on the OpenAI "
                                "endpoints); 429 and 503 carry retry_after_ms and Retry-After."},
        "paths": {path: item for path, item in PATHS.items() if path in served or path in PARAMETRISED},
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
        },
    }
