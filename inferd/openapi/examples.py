"""The interactive page's examples and groups (`/docs`, from the OpenAPI document): each route's request
body and path parameters as a minimal call the default config answers (`make run`: the seed's
`batchstring` and the packaged `minilm`; `tiny` is `config/generation.toml`'s model), so that "Try it
out" then "Execute" sends what works rather than Swagger's `"model": "string"`; and each route under the
ecosystem whose clients call it.
"""

from __future__ import annotations

from typing import Any

_INFER = {"input": "hello", "model": "batchstring"}
_V2_INFER = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
_TEXTS = ["a fine day for a walk", "what batching servers do"]

EXAMPLES: dict[str, Any] = {
    "/v1/inference": _INFER, "/api/inference": _INFER,
    "/v1/embeddings": {"input": _TEXTS, "model": "minilm"},
    "/embeddings": {"input": _TEXTS, "model": "minilm"},
    "/embed": {"inputs": _TEXTS}, "/": {"inputs": _TEXTS},
    "/similarity": {"inputs": {"source_sentence": "what batching servers do", "sentences": _TEXTS}},
    "/embed_all": {"inputs": _TEXTS[0]},
    "/v2/embed": {"texts": _TEXTS, "model": "minilm", "input_type": "search_document"},
    "/v1/rerank": {"query": "what batching servers do", "documents": _TEXTS},
    "/rerank": {"query": "what batching servers do", "texts": _TEXTS},
    "/v1/classify": {"input": _TEXTS}, "/classify": {"input": _TEXTS}, "/predict": {"inputs": _TEXTS[0]},
    "/tokenize": {"inputs": _TEXTS[0]}, "/decode": {"ids": [101, 7592, 2088, 102]},
    "/v1/completions": {"model": "tiny", "prompt": "A batching server", "max_tokens": 16},
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "What is batching?"}], "max_tokens": 16},
    "/v2/models/{model}/infer": _V2_INFER, "/v2/models/{model}/versions/{version}/infer": _V2_INFER,
    "/v1/admin/models": {"name": "batchstring", "version": "2", "backend": "inferd.backends.sim:create"},
    "/v1/admin/models/{model}/traffic": {"1": 90, "2": 10},
}
PARAMETERS = {"model": "batchstring", "version": "1"}

_TEI = ("/", "/embed", "/embed_all", "/rerank", "/predict", "/similarity", "/tokenize", "/decode", "/health", "/info")
_OPERATIONS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/v1/stats", "/v1/limits", "/v1/dead-letters")
# The page's groups: a path's own, else its prefix's (the first that fits), else operations.
_GROUPS = {"/v1/inference": "inferd", "/api/inference": "inferd", "/v2/embed": "Cohere and Jina",
           "/v1/rerank": "Cohere and Jina", "/v1/classify": "vLLM", "/version": "vLLM", "/ping": "vLLM",
           "/embeddings": "Infinity", "/classify": "Infinity", "/models": "Infinity",
           **dict.fromkeys(_TEI, "Text Embeddings Inference"), **dict.fromkeys(_OPERATIONS, "operations")}
_PREFIXES = (("/v1/admin/", "admin"), ("/v2", "KServe v2 and Triton"), ("/v1/", "OpenAI"))


def tag_of(path: str) -> str:
    return _GROUPS.get(path) or next((group for start, group in _PREFIXES if path.startswith(start)), "operations")


def with_examples(paths: dict[str, Any]) -> None:
    """Give every operation of `paths` its group, and its body and path parameters their examples."""
    for path, item in paths.items():
        for operation in item.values():
            operation["tags"] = [tag_of(path)]
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None and path in EXAMPLES:
                body["example"] = EXAMPLES[path]
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter["name"] in PARAMETERS:
                    parameter["example"] = PARAMETERS[parameter["name"]]
