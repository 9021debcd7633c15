"""The named schemas of the OpenAPI document (`openapi`): the bodies and answers its paths refer to
by `ref(name)`, and the error shapes (inferd's, OpenAI's, the Open Inference Protocol's)."""

from __future__ import annotations

from typing import Any

from ..wire.vector_types import VECTOR_TYPES
from .parts import DIMENSIONS, GENERATION_FIELDS, MODEL, TIMEOUT, or_null, ref

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
    "TeiEmbedAllRequest": {"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
            {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}}]},
        "truncate": or_null({"type": "boolean"}), "truncation_direction": {"enum": ["Right", "right"]}, "model": MODEL,
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
    "TeiSimilarityRequest": {"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "object", "required": ["source_sentence", "sentences"], "properties": {
            "source_sentence": {"type": "string", "minLength": 1},
            "sentences": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}}},
        "truncate": or_null({"type": "boolean"}), "model": MODEL, "timeout_ms": TIMEOUT}},
    "InfinityRerankResponse": {"type": "object", "required": ["object", "results", "model", "usage"], "properties": {
        "object": {"const": "rerank"}, "model": {"type": "string"}, "usage": {"type": "object"},
        "results": {"type": "array", "items": {"type": "object", "required": ["relevance_score", "index"], "properties": {
            "index": {"type": "integer", "minimum": 0}, "relevance_score": {"type": "number"},
            "document": {"type": ["string", "null"]}}}}}},
    "Readiness": {"type": "object", "required": ["ready", "phase", "models"], "properties": {
        "ready": {"type": "boolean"}, "phase": {"enum": ["starting", "serving", "lame_duck", "draining"]},
        "models": {"type": "object"}}},
}
# Infinity's client sends OpenAI's body with `dimensions: 0` (the whole vector) and `modality` ("text" here)
SCHEMAS["InfinityEmbeddingsRequest"] = {**SCHEMAS["EmbeddingsRequest"], "properties": {
    **SCHEMAS["EmbeddingsRequest"]["properties"], "modality": {"const": "text"},
    "dimensions": or_null({"type": "integer", "minimum": 0, "description": "0: the whole vector"})}}
