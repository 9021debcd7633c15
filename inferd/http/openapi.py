"""The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.

Written by hand, next to the handlers it describes, and kept true two ways: a test checks that its
paths are exactly the server's routes, and schemathesis sends it generated requests against a live
server (tests/e2e/test_openapi.py) and checks every answer against it: no 500, no undocumented status,
no body outside its schema. A server without a generation model serves it without the OpenAI text
endpoints.

Why one module: it is one document. Its schemas are named from the paths; split, a reader would chase
one document across files, and the test above checks it whole against the routes. Only the parts its
paths share (references, error responses, common fields and headers) are apart, in `openapi_parts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .openapi_parts import (
    CHOICES,
    COMPUTE_ERRORS,
    DIMENSIONS,
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
from .vector_types import VECTOR_TYPES

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
    "/v1/rerank": {"post": {
        "summary": "Cohere's rerank (Jina's clients too): each (query, document) pair batched like a request, "
                   "answered best first",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("RerankRequest")}}},
        "responses": {"200": json_body(ref("RerankResponse"), "the documents' scores, best first"),
                      **error_responses("Error", COMPUTE_ERRORS)},
    }},
    "/rerank": {"post": {
        "summary": "Text Embeddings Inference's rerank: the same computation, TEI's body and answer",
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
    "/v2/embed": {"post": {
        "summary": "Cohere's embed: the same computation as /v1/embeddings, each vector in the types asked",
        "parameters": HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("CohereEmbedRequest")}}},
        "responses": {"200": json_body(ref("CohereEmbedResponse"), "the vectors by type, in the texts' order"),
                      **error_responses("Error", COMPUTE_ERRORS)},
    }},
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
for _suffix, _item in (("", _V2_METADATA), ("/ready", _V2_READY), ("/infer", _V2_INFER)):
    for _prefix, _parameters in (("/v2/models/{model}", [_V2_MODEL]), ("/v2/models/{model}/versions/{version}",
                                                                        [_V2_MODEL, _V2_VERSION])):
        PATHS[_prefix + _suffix] = {method: {**op, "parameters": _parameters} for method, op in _item.items()}
PATHS.update(TOKEN_PATHS)
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

for _operations in PATHS.values():  # every route: a request with a method it does not take is a 405
    for _operation in _operations.values():
        _operation["responses"].setdefault("405", json_body(ref("Error"), "the path takes another method"))

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "message", "request_id"], "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. SERVICE_OVERLOADED"},
        "message": {"type": "string"}, "request_id": {"type": "string"},
        "retry_after_ms": {"type": "integer", "minimum": 1, "description": "with 429 and 503"}}},
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {
        "error": {"type": "object", "required": ["message", "type", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
            "code": {"type": "string"}, "retry_after_ms": {"type": "integer"}}},
        "request_id": {"type": "string"}}},
    "InferenceRequest": {"type": "object", "required": ["input"], "properties": {
        "input": {"oneOf": [{"type": "string"}, ref("ImageInput")]}, "model": MODEL, "timeout_ms": TIMEOUT,
        "version": or_null({"type": "string", "description": "a pinned version (or model@version); default: the split"}),
        "encoding_format": or_null({"enum": ["float", "base64"]}), **GENERATION_FIELDS}},
    "InferenceResponse": {"type": "object", "required": ["output", "request_id", "model", "latency_ms"], "properties": {
        "output": {"description": "the model's output: text, a vector (or base64 of its float32s), a label and score"},
        "request_id": {"type": "string"}, "model": {"type": "string"}, "latency_ms": {"type": "number"},
        "model_version": {"type": "string", "description": "the version that computed it (also X-Model-Version)"},
        "finish_reason": {"type": ["string", "null"]}, "usage": {"type": "object"}}},
    "EmbeddingsRequest": {"type": "object", "required": ["input"], "properties": {
        "input": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
            {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}},
            ref("ImageInput"), {"type": "array", "minItems": 1, "items": ref("ImageInput")}]},
        "model": MODEL, "timeout_ms": TIMEOUT, "encoding_format": {"enum": list(VECTOR_TYPES)},
        "dimensions": DIMENSIONS, "user": {"type": "string"}}},
    "CohereEmbedRequest": {"type": "object", "required": ["texts"], "properties": {
        "texts": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "input_type": {"enum": ["search_document", "search_query", "classification", "clustering"]},
        "embedding_types": {"type": "array", "minItems": 1, "items": {"enum": list(VECTOR_TYPES)}},
        "truncate": {"enum": ["END", "NONE"]}, "output_dimension": {"type": "integer", "minimum": 1},
        "model": MODEL, "timeout_ms": TIMEOUT}},
    "CohereEmbedResponse": {"type": "object", "required": ["id", "embeddings", "texts", "meta", "response_type"],
                            "properties": {"id": {"type": "string"}, "texts": {"type": "array"}, "meta": {"type": "object"},
                                           "response_type": {"const": "embeddings_by_type"}, "embeddings": {
                                               "type": "object", "additionalProperties": {"type": "array"}}}},
    "TeiEmbedRequest": {"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
            {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}}]},
        "normalize": {"type": "boolean"}, "truncate": or_null({"type": "boolean"}),
        "truncation_direction": {"enum": ["Right", "right"]}, "dimensions": DIMENSIONS, "model": MODEL,
        "timeout_ms": TIMEOUT}},
    "EmbeddingsResponse": {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
        "object": {"const": "list"}, "model": {"type": "string"}, "usage": {"type": "object"},
        "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
            "object": {"const": "embedding"}, "index": {"type": "integer"},
            "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}}}},
    "ImageInput": {"type": "object", "required": ["image"], "additionalProperties": False, "properties": {
        "image": {"type": "string", "minLength": 1, "description": "an image model's input: base64, or a data URL"}}},
    "RerankRequest": {"type": "object", "required": ["query", "documents"], "properties": {
        "query": {"type": "string", "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string", "minLength": 1}}}]}},
        "top_n": or_null({"type": "integer", "minimum": 1}), "return_documents": or_null({"type": "boolean"}),
        "model": MODEL, "timeout_ms": TIMEOUT}},
    "RerankResponse": {"type": "object", "required": ["id", "results", "model", "usage"], "properties": {
        "id": {"type": "string"}, "model": {"type": "string"}, "usage": {"type": "object"}, "meta": {"type": "object"},
        "results": {"type": "array", "items": {"type": "object", "required": ["index", "relevance_score"], "properties": {
            "index": {"type": "integer", "minimum": 0}, "relevance_score": {"type": "number"},
            "document": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}}}}}},
    "TeiRerankRequest": {"type": "object", "required": ["query", "texts"], "properties": {
        "query": {"type": "string", "minLength": 1},
        "texts": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "raw_scores": or_null({"type": "boolean"}), "return_text": or_null({"type": "boolean"}),
        "truncate": or_null({"type": "boolean"}), "model": MODEL, "timeout_ms": TIMEOUT}},
    "OpenInferenceError": {"type": "object", "required": ["error"], "properties": {
        "error": {"type": "string"}, "code": {"type": "string"}, "request_id": {"type": "string"},
        "retry_after_ms": {"type": "integer", "minimum": 1}}},
    "OpenInferenceRequest": {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object", "properties": {
            "timeout": {"type": "integer", "minimum": 1, "description": "the deadline, in microseconds (Triton's)"},
            "binary_data_output": {"type": "boolean"}}},
        "inputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["name", "datatype", "shape"], "properties": {
                "name": {"const": "text"}, "datatype": {"const": "BYTES"},
                "shape": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                "data": {"type": "array", "items": {"type": ["string", "array"]}},
                "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}}}}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"const": "output"},
            "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}}}}}}},
    "OpenInferenceResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name", "datatype", "shape"]}}}},
    "Readiness": {"type": "object", "required": ["ready", "phase", "models"], "properties": {
        "ready": {"type": "boolean"}, "phase": {"enum": ["starting", "serving", "lame_duck", "draining"]},
        "models": {"type": "object"}}},
}


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
