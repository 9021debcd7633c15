"""The HTTP surface: one route table over aiohttp's low-level server.

aiohttp's Application layer (URL dispatcher, match info, middleware chain) cost about a tenth of the CPU
per request; a handful of fixed paths need none of it, so routing is a dict of exact paths, then a few
prefixes that route what is under them (the admin API, the Open Inference Protocol, one model). Requests
that compute something are counted as in flight for the whole handler, so a drain waits for them.
Every response is JSON (but /metrics) and carries `X-Request-ID`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from .. import __version__
from ..calls.context import CallContext
from ..errors import InferdError, MethodNotAllowed, ModelNotFound, NotFound
from ..models.rollout import Rollouts
from ..openapi.document import openapi_document
from ..wire.json_values import dumps
from .about import AboutApi
from .admin import PREFIX as ADMIN_PREFIX
from .admin import AdminApi
from .api_page import PAGE_FILES, ApiPage
from .body_reader import BodyReader, entered
from .fast_path import FastPath
from .generation import GENERATION_PATHS, GenerationApi
from .idempotency import IdempotentReplies
from .inference import InferenceApi
from .open_inference import OpenInferenceApi
from .operations import OperationsApi, ServerFigures
from .responses import WholeResponse, error_response, openai_path
from .routes import Handler, PathHandler, Route
from .tokens import TokensApi


class HttpApi:
    """Routes requests to the inference, embeddings and generation handlers, and answers the
    operations endpoints (health, readiness, models, limits, stats, dead letters, metrics). Each API
    declares its calls' routes (`routes()`); the operations' and the document's are listed here."""

    def __init__(
        self, context: CallContext, body: BodyReader, figures: ServerFigures, idempotency: IdempotentReplies, *,
        rollouts: Rollouts | None = None, file_drift: Callable[[], dict[str, Any]] | None = None, fast_path: bool = True,
    ) -> None:
        self.models = models = context.models
        self.admission = admission = context.admission
        self.lifecycle = context.lifecycle
        self.ids = context.ids
        self.idempotency = idempotency
        generation = GenerationApi(context, body) if models.generation else None
        inference = InferenceApi(context, body, generation)
        self.open_inference = OpenInferenceApi(context, body)
        # (the fast path answers from the connection)
        self.fast_path = FastPath(inference, self.open_inference, context.lifecycle, context.tracing) if fast_path else None
        self.admin = AdminApi(rollouts=rollouts, auth=admission.auth, body=body, ids=self.ids,
                              file_drift=file_drift) if rollouts else None
        ops = OperationsApi(context, figures, idempotency)
        about = AboutApi(context, lambda: self.ready)
        tokens = TokensApi(context, body)
        # The route table: exact paths (`routes`), then the prefixes that route what is under them (`prefixes`).
        self.routes: dict[str, Route] = {
            **inference.routes(),
            **(generation.routes() if generation is not None else {}),
            "/tokenize": Route("POST", tokens.tokenize, True), "/decode": Route("POST", tokens.decode, True),
            "/healthz": Route("GET", about.healthz),
            "/readyz": Route("GET", about.readyz),
            "/health": Route("GET", about.health), "/version": Route("GET", about.version),
            "/ping": Route("GET", about.health),  # (vLLM's and SageMaker's name for the same probe)
            "/info": Route("GET", about.info),
            "/v1/models": Route("GET", ops.list_models), "/models": Route("GET", ops.infinity_models),
            "/v1/stats": Route("GET", ops.stats),
            "/v1/dead-letters": Route("GET", ops.dead_letters),
            "/v1/limits": Route("GET", ops.limits),
        }
        if figures.registry is not None:
            self.routes["/metrics"] = Route("GET", ops.prometheus)
        # A request with an Idempotency-Key goes through the replies' wrapper (only those: no frame for the rest).
        self._keyed: dict[str, Handler] = {} if idempotency.window_s <= 0 else {
            path: idempotency.wrap(route.handler, join=route.keyed == "join", openai=route.openai_errors)
            for path, route in self.routes.items() if route.keyed}
        self.routes["/openapi.json"] = Route("GET", self.openapi)
        page = ApiPage()  # /docs: the document as an interactive page
        self.routes["/docs"] = Route("GET", page.page)
        self.routes.update({path: Route("GET", page.asset) for path in PAGE_FILES})
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
                    self.routes[path] = self.routes[path]._replace(handler=self._operations_only(self.routes[path].handler))
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
            if path in GENERATION_PATHS:  # (without a generation model: a 404 that says so)
                error = ModelNotFound(f"this server serves no generation model: {path} has nothing to answer; see GET /v1/models")
            return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")), openai=openai_path(path))
        return self._wrong_method(request, path, route.method)

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
