"""The HTTP surface: one route table over aiohttp's low-level server.

aiohttp's Application layer (URL dispatcher, match info, middleware chain) cost about a tenth of the CPU
per request; a handful of fixed paths need none of it, so routing is a dict of exact paths, then a few
prefixes that route what is under them (the admin API, the Open Inference Protocol, one model). Requests
that compute something are counted as in flight for the whole handler, so a drain waits for them.
Every response is JSON (but /metrics) and carries `X-Request-ID`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry

from .. import __version__
from ..admission.admission import Admission
from ..admission.rate_limits import RateLimiter
from ..calls.request_ids import RequestIds
from ..errors import InferdError, MethodNotAllowed, ModelNotFound, NotFound
from ..lifecycle import Lifecycle
from ..models.registry import Models
from ..models.rollout import Rollouts
from ..observability.dead_letters import DeadLetters
from ..observability.outcomes import Outcomes
from ..observability.tracing import Tracing
from ..openapi.document import openapi_document
from ..wire.json_values import dumps
from .about import AboutApi
from .admin import PREFIX as ADMIN_PREFIX
from .admin import AdminApi
from .api_page import PAGE_FILES, ApiPage
from .body_reader import BodyReader, entered
from .call_tracing import CallHandler, traced_route
from .fast_path import FastPath
from .generation import GenerationApi
from .idempotency import IdempotentReplies
from .inference import InferenceApi
from .open_inference import OpenInferenceApi
from .operations import OperationsApi
from .responses import WholeResponse, error_response, openai_path
from .tokens import TokensApi

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
PathHandler = Callable[[web.BaseRequest, str], Awaitable[web.StreamResponse]]  # (a prefix's: it routes the rest)


class Route(NamedTuple):
    """An exact path's route."""

    method: str
    handler: Handler
    counted: bool  # in flight while it runs: a drain waits for it


_KEYED_PATHS = ("/v1/inference", "/api/inference", "/v1/embeddings", "/embeddings", "/v1/rerank", "/rerank", "/embed",
                "/v2/embed", "/v1/classify", "/classify", "/predict", "/similarity")
_INFERD_ERRORS = ("/v1/inference", "/api/inference", "/v1/rerank", "/rerank", "/embed", "/v2/embed", "/predict",
                  "/classify", "/similarity")  # (the other keyed paths: OpenAI's)
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class HttpApi:
    """Routes requests to the inference, embeddings and generation handlers, and answers the
    operations endpoints (health, readiness, models, limits, stats, dead letters, metrics)."""

    def __init__(
        self, *, models: Models, admission: Admission, lifecycle: Lifecycle, outcomes: Outcomes, limiter: RateLimiter,
        dead_letters: DeadLetters, registry: CollectorRegistry | None, body: BodyReader,
        connections: Callable[[], dict[str, int]] | None = None, idempotency_window_s: float = 0.0,
        idempotency_max_keys: int = 1, idempotency_max_bytes: int = 64 << 20, tracing: Tracing | None = None,
        rollouts: Rollouts | None = None, fast_path: bool = True,
        file_drift: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.models = models
        self.admission = admission
        self.lifecycle = lifecycle
        self.ids = RequestIds()
        generation = None
        if models.generation:
            generation = GenerationApi(models=models, admission=admission, outcomes=outcomes,
                                       lifecycle=lifecycle, ids=self.ids, body=body)
        inference = InferenceApi(models=models, admission=admission, outcomes=outcomes, lifecycle=lifecycle, ids=self.ids,
                                 body=body, generation=generation)
        untraced: tuple[CallHandler, ...] = (inference.inference, inference.embeddings, inference.rerank,
                                             inference.tei_rerank, inference.tei_embed, inference.cohere_embed,
                                             inference.classify, inference.tei_predict, inference.infinity_classify,
                                             inference.infinity_embeddings, inference.tei_similarity,
                                             inference.tei_root_embed)
        call_routes: tuple[Handler, ...] = untraced if tracing is None else tuple(
            traced_route(tracing, self.ids, route) for route in untraced)
        self.open_inference = OpenInferenceApi(models=models, admission=admission, outcomes=outcomes, lifecycle=lifecycle,
                                               ids=self.ids, body=body, tracing=tracing)
        # (the fast path answers from the connection)
        self.fast_path = FastPath(inference, self.open_inference, lifecycle, tracing) if fast_path else None
        self.admin = AdminApi(rollouts=rollouts, auth=admission.auth, body=body, ids=self.ids,
                              file_drift=file_drift) if rollouts else None
        self.idempotency = IdempotentReplies(admission.auth, body, self.ids, idempotency_window_s, idempotency_max_keys,
                                             idempotency_max_bytes)
        keyed = self.idempotency.wrap
        ops = OperationsApi(models=models, admission=admission, limiter=limiter, lifecycle=lifecycle, ids=self.ids,
                            dead_letters=dead_letters, registry=registry, idempotency=self.idempotency,
                            connections=connections)
        about = AboutApi(models, self.ids, lifecycle, lambda: self.ready, admission.auth)
        tokens = TokensApi(models=models, admission=admission, ids=self.ids, body=body)
        # The route table: exact paths (`routes`), then the prefixes that route what is under them (`prefixes`).
        self.routes: dict[str, Route] = {path: Route(*route) for path, route in {
            "/v1/inference": ("POST", call_routes[0], True),
            "/api/inference": ("POST", call_routes[0], True),
            "/v1/embeddings": ("POST", call_routes[1], True),
            "/v1/rerank": ("POST", call_routes[2], True),
            "/rerank": ("POST", call_routes[3], True),
            "/embed": ("POST", call_routes[4], True),
            "/v2/embed": ("POST", call_routes[5], True),
            "/v1/classify": ("POST", call_routes[6], True),
            "/predict": ("POST", call_routes[7], True),
            # Infinity's paths without `/v1` (its rerank body posts to `/rerank`, beside TEI's: the body says which)
            "/embeddings": ("POST", call_routes[9], True), "/classify": ("POST", call_routes[8], True),
            "/similarity": ("POST", call_routes[10], True),
            "/": ("POST", self._tei_root(call_routes[11], call_routes[7], call_routes[3]), True),
            "/tokenize": ("POST", tokens.tokenize, True), "/decode": ("POST", tokens.decode, True),
            "/healthz": ("GET", about.healthz, False),
            "/readyz": ("GET", about.readyz, False),
            "/health": ("GET", about.health, False), "/version": ("GET", about.version, False),
            "/ping": ("GET", about.health, False),  # (vLLM's and SageMaker's name for the same probe)
            "/info": ("GET", about.info, False),
            "/v1/models": ("GET", ops.list_models, False), "/models": ("GET", ops.infinity_models, False),
            "/v1/stats": ("GET", ops.stats, False),
            "/v1/dead-letters": ("GET", ops.dead_letters, False),
            "/v1/limits": ("GET", ops.limits, False),
        }.items()}
        if registry is not None:
            self.routes["/metrics"] = Route("GET", ops.prometheus, False)
        if generation is not None:
            completions: Handler = generation.completions
            chat: Handler = generation.chat_completions
            if tracing is not None:
                completions = traced_route(tracing, self.ids, generation.completions)
                chat = traced_route(tracing, self.ids, generation.chat_completions)
            self.routes["/v1/completions"] = Route("POST", completions, True)
            self.routes["/v1/chat/completions"] = Route("POST", chat, True)
        # A request with an Idempotency-Key goes through the replies' wrapper (only those: no frame for the rest).
        self._keyed: dict[str, Handler] = {} if idempotency_window_s <= 0 else {
            path: keyed(self.routes[path].handler, join=path not in _GENERATION_PATHS, openai=path not in _INFERD_ERRORS)
            for path in (*_KEYED_PATHS, *_GENERATION_PATHS) if path in self.routes}
        self.routes["/openapi.json"] = Route("GET", self.openapi, False)
        page = ApiPage()  # /docs: the document as an interactive page
        self.routes["/docs"] = Route("GET", page.page, False)
        self.routes.update({path: Route("GET", page.asset, False) for path in PAGE_FILES})
        self._model_route: Handler = ops.model  # GET /v1/models/{id}: the one path with a parameter of its own
        self.prefixes: tuple[tuple[str, PathHandler], ...] = (
            *(((ADMIN_PREFIX, self.admin.route),) if self.admin is not None else ()),
            ("/v2", self._open_inference),  # (its own routes, in its own error shape)
            ("/v1/models/", self._one_model),
        )
        self._openapi = dumps(openapi_document(self.routes, __version__))
        if admission.auth.config.operations != "open":
            for path in ("/metrics", "/v1/stats", "/v1/models", "/models"):
                if path in self.routes:
                    method, handler, counted = self.routes[path]
                    self.routes[path] = Route(method, self._operations_only(handler), counted)
            self._model_route = self._operations_only(ops.model)

    @property
    def ready(self) -> bool:
        """Should load balancers send traffic here: serving, and every model ready."""
        return self.lifecycle.serving and self.models.ready

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The low-level server's one handler: route by exact path, then method. The path as sent, not
        percent-decoded: `/%6Detrics` is not `/metrics`, so a proxy's rule on a path holds here too."""
        path = request.raw_path
        if "?" in path:
            path = path.partition("?")[0]
        if path[:1] != "/":  # the absolute form, as a proxy may send it: its path, still as sent
            path = request.rel_url.raw_path
        route = self.routes.get(path)
        if route is not None and route.method == request.method:
            if not route.counted:
                return await route.handler(request)
            lifecycle = self.lifecycle
            handler = route.handler
            if self._keyed and "Idempotency-Key" in request.headers:
                handler = self._keyed.get(path, handler)
            entered(lifecycle, request)
            try:
                return await handler(request)
            finally:
                lifecycle.leave()
        if route is None:
            for prefix, routed in self.prefixes:
                if path.startswith(prefix):
                    return await routed(request, path)
            error: InferdError = NotFound(f"no route for {request.method} {path}")
            if path in _GENERATION_PATHS:
                error = ModelNotFound(f"this server serves no generation model: {path} has nothing to answer; see GET /v1/models")
            return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai_path(path))
        return self._wrong_method(request, path, route.method)

    def _tei_root(self, embed: Handler, predict: Handler, rerank: Handler) -> Handler:
        """Text Embeddings Inference's `POST /`, where Hugging Face's `InferenceClient` (and LangChain's
        and LlamaIndex's TEI embeddings through it) post: what the default model does, `/embed`'s body
        and answer unless it classifies (`/predict`) or reranks (`/rerank`)."""
        by_kind = {"classification": predict, "rerank": rerank}

        async def tei_root(request: web.BaseRequest) -> web.StreamResponse:
            model = self.models.route(self.models.default)
            return await by_kind.get(model.output_kind if model is not None else None, embed)(request)  # type: ignore[arg-type]
        return tei_root

    def _wrong_method(self, request: web.BaseRequest, path: str, method: str) -> web.StreamResponse:
        return error_response(MethodNotAllowed(f"{path} accepts {method} only"), self.ids.pick(request.headers.get("X-Request-ID")),
                              allow=method, openai=openai_path(path))

    async def _open_inference(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path != "/v2" and not path.startswith("/v2/"):  # (e.g. /v2embed: under no prefix after all)
            return error_response(NotFound(f"no route for {request.method} {path}"), self.ids.pick(request.headers.get("X-Request-ID")))
        return await self.open_inference.route(request, path)

    async def _one_model(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        """GET /v1/models/{id}."""
        if request.method != "GET":
            return self._wrong_method(request, path, "GET")
        return await self._model_route(request)

    def _operations_only(self, handler: Handler) -> Handler:
        async def guarded(request: web.BaseRequest) -> web.StreamResponse:
            try:
                self.admission.auth.require_operations(request.headers)
            except InferdError as error:
                return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")),
                                      openai=openai_path(request.rel_url.raw_path))
            return await handler(request)
        return guarded

    async def openapi(self, request: web.BaseRequest) -> web.StreamResponse:
        """This server's OpenAPI 3.1 document (`openapi.py`)."""
        return WholeResponse(200, self._openapi, (("X-Request-ID", self.ids.pick(request.headers.get("X-Request-ID"))),))
